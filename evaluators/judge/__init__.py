"""LLM-as-a-judge machinery behind the ``llm_judge`` kind (``evaluators/kinds/llm_judge.py``).

- ``context``      the evaluation context (shared with code evaluators) and template variables
- ``templates``    curly and sandboxed jinja2 prompt templates: render_all, syntax_problems
- ``render_pool``  the render worker processes templates render in (deadline, memory limit)
- ``render_worker`` a render worker's main; ``rendering`` the two template languages it runs
- ``scripts``      script prompt templates run in the code sandbox
- ``scores``       score shapes: answer schema, outputs schema, reading answers back
- ``client``       one chat-completions request: limiter, retries, Retry-After, costs
- ``limits``       the Redis rate limiter per connection and spend counters
- ``batch``        a batch of judgements (and ``structured_call``): concurrency, repair, traces
- ``traces``       the hook the runs app registers its trace recorder into
- ``connections``  model connection services (create, update, test) and the address check
- ``conf``         the settings the judge reads

Nothing here imports views; ``runs`` is reached only through ``traces.TRACE_RECORDERS``.
"""

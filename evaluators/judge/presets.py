"""Built-in judge prompts: the default (correctness against a reference) and the presets."""

from __future__ import annotations

CORRECTNESS = [
    {
        "role": "system",
        "content": "You are an impartial grader. Decide how correct the candidate answer is, "
        "taking the reference answer as the truth. Judge the facts, not the style or the "
        "length: an answer that says the same thing in other words is fully correct, one that "
        "is partly right gets partial credit.",
    },
    {
        "role": "user",
        "content": "Input:\n{{question}}\n\nReference answer:\n{{reference}}\n\n"
        "Candidate answer:\n{{outputs}}",
    },
]

HALLUCINATION = [
    {
        "role": "system",
        "content": "You check answers for hallucinations. The answer passes when every claim it "
        "makes is supported by the inputs it was given; it fails when it states anything the "
        "inputs do not support or contradict.",
    },
    {"role": "user", "content": "Inputs:\n{{inputs}}\n\nAnswer:\n{{outputs}}"},
]

CONCISENESS = [
    {
        "role": "system",
        "content": "You rate how concise an answer is: 5 says exactly what the question needs "
        "and nothing more; 1 buries the answer in repetition, filler or unrequested detail.",
    },
    {"role": "user", "content": "Question:\n{{question}}\n\nAnswer:\n{{outputs}}"},
]

RELEVANCY = [
    {
        "role": "system",
        "content": "You rate how relevant an answer is to the question, from 0 (ignores the "
        "question) to 1 (addresses exactly what was asked). Correctness is not your concern.",
    },
    {"role": "user", "content": "Question:\n{{question}}\n\nAnswer:\n{{outputs}}"},
]

HELPFULNESS = [
    {
        "role": "system",
        "content": "You judge how helpful an assistant's answer is to the person who asked: "
        "does it solve their problem, completely and usably?",
    },
    {"role": "user", "content": "Request:\n{{question}}\n\nAssistant's answer:\n{{outputs}}"},
]

RUBRIC = [
    {
        "role": "system",
        "content": "You grade an answer against a rubric. Score every criterion on its own.",
    },
    {
        "role": "user",
        "content": "Input:\n{{question}}\n\nReference answer (null when there is none):\n"
        "{{reference_answer}}\n\nAnswer to grade:\n{{outputs}}",
    },
]

PYTHON_SCRIPT = """\
from evalsite_eval import define_prompt_template


@define_prompt_template
def prompt(ctx):
    lines = [f"Question: {ctx.question}", f"Answer: {ctx.candidate_answer}"]
    if ctx.reference_answer is not None:
        lines.append(f"Reference: {ctx.reference_answer}")
    return "Grade the answer for correctness.\\n" + "\\n".join(lines)
"""

PRESETS = [
    (
        "correctness",
        "Correctness against a reference",
        "A score from 0 to 1 for how well the answer matches the reference answer.",
        {"messages": CORRECTNESS, "score_type": "numeric", "score_min": 0, "score_max": 1},
    ),
    (
        "hallucination",
        "Hallucination",
        "Passes when every claim of the answer is supported by the inputs.",
        {"messages": HALLUCINATION, "score_type": "binary"},
    ),
    (
        "conciseness",
        "Conciseness",
        "An integer from 1 to 5; success from 4.",
        {
            "messages": CONCISENESS,
            "score_type": "numeric",
            "score_min": 1,
            "score_max": 5,
            "integer_scores": True,
            "threshold": 4,
        },
    ),
    (
        "answer_relevancy",
        "Answer relevancy",
        "A score from 0 to 1 for how well the answer addresses the question.",
        {"messages": RELEVANCY, "score_type": "numeric", "score_min": 0, "score_max": 1},
    ),
    (
        "helpfulness",
        "Helpfulness",
        "A label (unhelpful, partially helpful, helpful) mapped to 0, 0.5 and 1.",
        {
            "messages": HELPFULNESS,
            "score_type": "categorical",
            "categories": [
                {"label": "unhelpful", "score": 0},
                {"label": "partially_helpful", "score": 0.5},
                {"label": "helpful", "score": 1},
            ],
        },
    ),
    (
        "rubric",
        "Rubric (weighted criteria)",
        "Each criterion scored 0 to 1; the score is their weighted mean.",
        {
            "messages": RUBRIC,
            "score_type": "rubric",
            "criteria": [
                {"name": "accuracy", "description": "The facts are right.", "weight": 3},
                {
                    "name": "completeness",
                    "description": "Nothing asked for is missing.",
                    "weight": 2,
                },
                {"name": "clarity", "description": "Easy to read and follow.", "weight": 1},
            ],
            "threshold": 0.7,
        },
    ),
    (
        "python_script_prompt",
        "Prompt from a Python script",
        "The prompt is written by a script run in the sandbox (define_prompt_template).",
        {"prompt_source": "script", "script_runtime": "python", "script": PYTHON_SCRIPT},
    ),
]

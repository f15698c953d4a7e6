"""The WSGI entry point (gunicorn, `manage.py up`).

Start-up builds hundreds of thousands of long-lived objects (models, URL patterns, serializers);
left to the cyclic garbage collector, every collection walks them again, which measured about a
quarter to a half of an ingest request's CPU. They are loaded up front and frozen out of its
way, and the first generation collects less often (requests allocate many short-lived
containers). docs/traces.md, "Throughput".
"""

import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
application = get_wsgi_application()

import evalsite.urls  # noqa: E402,F401  (every view and serializer, before the freeze)

gc.collect()
gc.freeze()
gc.set_threshold(20_000, 20, 50)

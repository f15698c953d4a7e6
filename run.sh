#!/usr/bin/env bash
# Installs everything, then runs evalsite: migrations, demo data, web server and Celery workers.
# With no DATABASE_URL / CELERY_BROKER_URL it starts an embedded PostgreSQL and Redis in .data/.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
exec uv run python manage.py up "$@"

#!/usr/bin/env bash
# Installs everything (Chromium included), then runs the whole test suite with pytest.
# With no DATABASE_URL / CELERY_BROKER_URL the tests use the embedded PostgreSQL and Redis.
# Extra arguments go to pytest:  ./test.sh tests/evaluators -k regex
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh --browser
exec uv run pytest "$@"

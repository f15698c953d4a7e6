from runs.api import (
    alignment,
    compare,
    history,
    online,
    replay,
    results,
    review,
    runs,
    schemas,
    sessions,
    testsets,
    traces,
)

urlpatterns = [
    *compare.urlpatterns,
    *testsets.urlpatterns,
    *history.urlpatterns,
    *traces.urlpatterns,
    *sessions.urlpatterns,
    *replay.urlpatterns,
    *runs.urlpatterns,
    *results.urlpatterns,
    *online.urlpatterns,
    *schemas.urlpatterns,
    *review.urlpatterns,
    *alignment.urlpatterns,
]

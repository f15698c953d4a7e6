from runs.api import (
    alignment,
    compare,
    history,
    online,
    results,
    review,
    runs,
    schemas,
    testsets,
    traces,
)

urlpatterns = [
    *compare.urlpatterns,
    *testsets.urlpatterns,
    *history.urlpatterns,
    *traces.urlpatterns,
    *runs.urlpatterns,
    *results.urlpatterns,
    *online.urlpatterns,
    *schemas.urlpatterns,
    *review.urlpatterns,
    *alignment.urlpatterns,
]

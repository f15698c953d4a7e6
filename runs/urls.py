from runs.views import (
    alignment,
    compare,
    history,
    online,
    reliability,
    review,
    runs,
    scenarios,
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
    *scenarios.urlpatterns,
    *online.urlpatterns,
    *schemas.urlpatterns,
    *review.urlpatterns,
    *reliability.urlpatterns,
    *alignment.urlpatterns,
]

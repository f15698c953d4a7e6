from runs.views import (
    alignment,
    compare,
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
    *traces.urlpatterns,
    *runs.urlpatterns,
    *scenarios.urlpatterns,
    *online.urlpatterns,
    *schemas.urlpatterns,
    *review.urlpatterns,
    *reliability.urlpatterns,
    *alignment.urlpatterns,
]

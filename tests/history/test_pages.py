"""The history page: the planted classes in a grid of coloured cells linking to the drill-in,
the class filter (full page and HTMX fragment), tag and run filters, refusals shown inline,
the link from the testset page, and isolation."""

from __future__ import annotations

import re

from django.db import connection

from tests.history.conftest import CASES

URL = "/p/acme/testsets/planted/history"
HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "history-grid"}


def rows(page: str) -> dict[str, str]:
    """Case name -> the row's HTML."""
    found = {}
    for row in re.findall(r"<tr><td class=\"num id\">(\d+)</td>(.*?)</tr>", page, re.S):
        found[CASES[int(row[0])]] = row[1]
    return found


def test_it_renders_the_planted_classes_in_a_grid(viewer_client, planted):
    _, runs = planted
    response = viewer_client.get(URL + "?tag=branch:main")
    page = response.content.decode()
    assert response.status_code == 200 and "<html" in page and "css/history.css" in page
    found = rows(page)
    assert set(found) == set(CASES)
    for name, label in (
        ("stable pass", "stable pass"),
        ("stable fail", "stable fail"),
        ("flaky", "flaky"),
        ("regressed", "regressed"),
        ("fixed", "fixed"),
        ("errored", "stable pass"),
    ):
        assert f">{label}</span>" in found[name], name
    assert "67%" in found["flaky"]  # 2 flips over 3 pairs of verdicts
    cells = re.findall(r'<td class="hv hv-(\w+)">', found["flaky"])
    assert cells == ["pass", "fail", "pass", "pass"]
    assert re.findall(r'<td class="hv hv-(\w+)"', found["errored"])[-1] == "error"
    drill = f'href="/p/acme/runs/{runs[3].pk}/scenarios/3/"'
    assert drill in found["regressed"]
    assert f'href="/p/acme/runs/{runs[0].pk}/"' in page  # the column header links to the run
    assert "base</span>" in page and "cand</span>" in page and "main" in page


def test_it_filters_by_class_with_a_plain_link(viewer_client, planted):
    page = viewer_client.get(URL + "?tag=branch:main").content.decode()
    link = re.search(r'href="(\?[^"]*class=regressed[^"]*)"', page).group(1)
    filtered = viewer_client.get(URL + link.replace("&amp;", "&")).content.decode()
    assert list(rows(filtered)) == ["regressed"]
    assert 'class="active" aria-current="page">regressed' in filtered


def test_it_swaps_only_the_grid_for_htmx(viewer_client, planted):
    response = viewer_client.get(URL + "?tag=branch:main&class=flaky", **HTMX)
    fragment = response.content.decode()
    assert fragment.strip().startswith('<section class="card flush" id="history-grid"')
    assert "<html" not in fragment and list(rows(fragment)) == ["flaky"]


def test_it_limits_the_runs_shown(viewer_client, planted):
    _, runs = planted
    page = viewer_client.get(URL + "?runs=2").content.decode()
    assert re.findall(r'<td class="hv hv-(\w+)">', rows(page)["fixed"]) == ["pass", "pass"]
    assert f"#{runs[0].pk}</a>" not in page and f"#{runs[4].pk}</a>" in page


def test_it_shows_bad_parameters_inline(viewer_client, planted):
    response = viewer_client.get(URL + "?runs=1&tag=branch:main")
    page = response.content.decode()
    assert response.status_code == 400 and 'role="alert"' in page and "runs:" in page
    assert 'value="branch:main"' in page  # the form keeps what was typed
    bad = viewer_client.get(URL + "?candidate=abc")
    assert bad.status_code == 400 and "candidate:" in bad.content.decode()


def test_it_links_the_history_from_the_testset_page(viewer_client, planted):
    page = viewer_client.get("/p/acme/testsets/planted/").content.decode()
    assert f'href="{URL}"' in page


def test_it_says_when_no_run_matches(viewer_client, planted):
    page = viewer_client.get(URL + "?tag=branch:nope").content.decode()
    assert "No finished runs" in page


def test_it_hides_another_projects_testset(outsider_client, planted):
    assert outsider_client.get(URL).status_code == 404
    assert outsider_client.get("/p/other/testsets/planted/history").status_code == 404


WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b|\bFOR\s+(NO\s+KEY\s+)?UPDATE\b|pg_advisory", re.I)


def test_the_page_the_fragment_and_the_api_only_read(viewer_client, planted):
    statements: list[str] = []

    def record(execute, sql, *args):
        statements.append(sql)
        return execute(sql, *args)

    viewer_client.get(URL)  # the session's project is stored by this first view
    with connection.execute_wrapper(record):
        assert viewer_client.get(URL + "?tag=branch:main").status_code == 200
        assert viewer_client.get(URL + "?class=flaky", **HTMX).status_code == 200
        api = viewer_client.get("/api/v1/testsets/planted/history", HTTP_X_PROJECT="acme")
        assert api.status_code == 200
    assert statements and not [s for s in statements if WRITE.search(s)]

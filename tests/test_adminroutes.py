"""The admin API's route table: matching paths, refusing names that climb out, the OpenAPI document.

In process: tests/test_admin.py drives the same table over HTTP, with a session.
"""
import re

import pytest

from _ragproxy.admin import Admin
from _ragproxy.adminroutes import ADMIN_ROUTES, match_route, openapi_document, refuse_traversal
from _ragproxy.api import ClientError


def test_every_route_names_an_admin_method_and_no_two_routes_collide():
    for route in ADMIN_ROUTES:
        assert callable(getattr(Admin, route.handler, None)), route
    shapes = [(r.method, re.sub(r"\{\w+\}", "{}", r.pattern)) for r in ADMIN_ROUTES]
    assert len(shapes) == len(set(shapes))


@pytest.mark.parametrize("route", ADMIN_ROUTES, ids=lambda r: f"{r.method} {r.pattern}")
def test_each_pattern_matches_its_own_path_and_names_its_parameters(route):
    names = re.findall(r"\{(\w+)\}", route.pattern)
    values = {name: f"v-{name}.1" for name in names}
    found, params = match_route(route.method, route.pattern.format(**values))
    assert found is route and params == values


def test_segments_are_percent_decoded_before_they_are_matched():
    route, params = match_route("GET", "kbs/my%20docs/files")
    assert route.handler == "list_files" and params == {"kb": "my docs"}
    assert match_route("GET", "kb%73")[0].handler == "list_kbs"   # %73 is "s"


def test_a_known_path_with_another_method_is_405_with_the_methods_it_takes():
    with pytest.raises(ClientError) as caught:
        match_route("PATCH", "kbs/docs")
    assert caught.value.status == 405 and caught.value.code == "method_not_allowed"
    assert dict(caught.value.headers)["Allow"] == "DELETE, GET, PUT"


@pytest.mark.parametrize("rest", ["nope", "kbs/docs/nope", "kbs//files", "", "providers/llm/x/test/more"])
def test_a_path_no_route_takes_is_404(rest):
    with pytest.raises(ClientError) as caught:
        match_route("GET", rest)
    assert caught.value.status == 404 and caught.value.code == "not_found"


@pytest.mark.parametrize("rest", ["kbs/..", "kbs/%2e%2e/files", "kbs/.", "kbs/a%00b", "kbs/..%2F..%2Fconfig",
                                  "kbs/C:%5Cwindows", "kbs/%2Fetc", "logs/%5C..%5Cx"])
def test_a_segment_that_could_climb_out_is_refused_before_any_route_is_looked_at(rest):
    with pytest.raises(ClientError) as caught:
        match_route("GET", rest)
    assert caught.value.status == 400 and caught.value.code == "invalid_name"


def test_a_segment_that_is_not_utf8_once_decoded_raises_for_the_caller_to_answer():
    with pytest.raises(UnicodeDecodeError):   # Admin.handle answers it with a 400
        match_route("GET", "kbs/%ff")


@pytest.mark.parametrize("name", ["docs", "a/b.md", "notes/../../x", "..", "/etc/passwd", "\\\\server\\x",
                                  "D:/x", "a\0b", "ok..name"])
def test_refuse_traversal_lets_through_only_names_that_stay_where_they_are_used(name):
    climbs = name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/") or "\0" in name \
        or name[1:3] in (":/", ":\\")
    if climbs:
        with pytest.raises(ClientError) as caught:
            refuse_traversal(name, "source")
        assert caught.value.status == 400 and repr(name) in caught.value.message
    else:
        assert refuse_traversal(name, "source") == name


def test_the_openapi_document_has_one_operation_per_route():
    doc = openapi_document()
    operations = [(method, path, op) for path, item in doc["paths"].items() for method, op in item.items()]
    assert len(operations) == len(ADMIN_ROUTES)
    for route in ADMIN_ROUTES:
        op = doc["paths"]["/admin/api/" + route.pattern][route.method.lower()]
        assert op["operationId"] == route.handler and op["summary"] == route.summary
        assert [p["name"] for p in op["parameters"]] == re.findall(r"\{(\w+)\}", route.pattern)
        assert ("401" in op["responses"]) is not route.public
        assert (op.get("security") == []) is route.public
        assert ("requestBody" in op) is (route.method in ("POST", "PUT"))
    assert doc["paths"]["/admin/api/kbs/{kb}/reindex"]["post"]["responses"].keys() >= {"202"}

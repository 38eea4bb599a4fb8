"""A NUL character in an admin path or query is a 400, not a 500.

Found by running the OpenAPI fuzzing (tests/reliability/test_schemathesis.py) against a
gateway on PostgreSQL instead of SQLite: names in the query are looked up in the
database, and PostgreSQL refuses text holding a NUL (`DataError`), where SQLite takes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.utils.admin_env import make_env
from tests.utils.services import postgres_database

REQUESTS = [
    ("GET", "/admin/api/v1/adapters?base_model=m%00"),
    ("POST", "/admin/api/v1/adapters/upload?name=a&base_model=m%00"),
    ("GET", "/admin/api/v1/prefixes?model=m%00"),
    ("GET", "/admin/api/v1/tenants/alpha%00"),
    ("GET", "/admin/api/v1/models/m%00"),
]


@pytest.mark.parametrize(("method", "target"), REQUESTS)
def test_a_nul_in_an_admin_path_or_query_is_a_400_on_postgresql(
    tmp_path: Path, method: str, target: str
) -> None:
    with postgres_database() as url:
        env = make_env(tmp_path, url)
        try:
            response = env.client.request(method, target, headers=env.token("admin"))
        finally:
            env.client.close()
    assert response.status_code == 400, response.text
    assert "may not contain NUL characters" in response.text

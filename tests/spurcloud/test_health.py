import pytest


@pytest.mark.django_db
def test_healthz_answers_without_a_login(client):
    answer = client.get("/healthz")
    assert answer.status_code == 200
    assert answer.json() == {"ok": True}

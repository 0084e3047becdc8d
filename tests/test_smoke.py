from helpers import invoke, load_example, run_auditlog


def test_version() -> None:
    r = invoke("--version")
    assert r.exit_code == 0 and "0.1.0" in r.stdout

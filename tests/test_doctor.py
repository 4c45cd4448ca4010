import socket
import subprocess
import sys
from pathlib import Path

from verl_memagent.doctor import run_doctor


def test_doctor_cli_reports_versions_and_plugin():
    done = subprocess.run(
        [sys.executable, "-m", "verl_memagent.cli", "doctor"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for label in ("python", "torch", "verl", "transformers", "ray", "vllm", "faiss-cpu", "bm25s", "GPUs"):
        assert any(line.split()[0] == label for line in out.splitlines() if line.strip()), label
    assert "loaded by verl discovery" in out and "yes" in out
    assert out.strip().endswith("doctor: ok")


def test_broken_plugin_shows_its_real_traceback(tmp_path: Path, monkeypatch):
    (tmp_path / "broken_memagent_plugin.py").write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    report = run_doctor(plugin_module="broken_memagent_plugin")
    text = "\n".join(report.lines)
    assert "Traceback" in text and "a_dependency_that_is_not_installed" in text
    assert report.failures and "broken_memagent_plugin fails to import" in report.failures[0]


def test_broken_plugin_makes_the_cli_fail(tmp_path: Path):
    code = (
        "import sys; sys.modules['verl_memagent.plugin'] = None\n"
        "from verl_memagent.cli import main; sys.exit(main(['doctor']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "doctor: FAILED: " in done.stderr and "verl_memagent.plugin" in done.stderr
    assert "Traceback" in done.stdout


def test_retriever_health_is_checked(retriever_url):
    report = run_doctor(retriever=retriever_url)
    assert any(f"{retriever_url}/health answers {{'status': 'ready'" in line for line in report.lines)
    assert not any("retriever" in reason for reason in report.failures)


def test_unreachable_retriever_fails():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        report = run_doctor(retriever=f"http://127.0.0.1:{port}")
    assert any("does not answer /health" in reason for reason in report.failures)

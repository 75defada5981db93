"""The README's OpenAI example runs as written, against the fake OpenAI server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from segue.testing.openai_server import FakeOpenAIServer, Reply

README = Path(__file__).resolve().parents[1] / "README.md"


def test_openai_example_runs_against_a_compatible_server(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    example = next(block for block in blocks if "OpenAIModel(AsyncOpenAI()" in block)
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    with FakeOpenAIServer(default=Reply(text="Because windows are finite.")) as server:
        env = {**os.environ, "OPENAI_API_KEY": "sk-readme-test", "OPENAI_BASE_URL": server.url}
        result = subprocess.run(  # noqa: S603  # our own interpreter on our own file
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            check=False,
            env=env,
        )
        requests = server.model_requests()
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("Because windows are finite.\n", "")
    assert (tmp_path / "chat.db").exists()
    assert requests[0].body["model"] == "gpt-4o"
    assert requests[0].path == "/v1/chat/completions"

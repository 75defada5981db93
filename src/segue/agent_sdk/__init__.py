"""Hosting Claude Agent SDK sessions: segue decides what happens at the limit, the SDK's agent
does the work (``pip install "segue[agent-sdk]"``).

``AgentSdkModel`` is an ``LlmModel``: give it to a ``Runtime`` with the SDK's own options, and
every behaviour works as with the Messages API adapter::

    from claude_agent_sdk import ClaudeAgentOptions
    from segue import ContextExhaustionBehavior, Runtime, SqliteStore
    from segue.agent_sdk import AgentSdkModel

    model = AgentSdkModel(ClaudeAgentOptions(cwd="/srv/work", allowed_tools=["Bash", "Read"]))
    async with Runtime(store=SqliteStore("agents.db"), llm=model) as rt:
        agent = await rt.create_conversation(
            model="claude-sonnet-4-5", behavior=ContextExhaustionBehavior.CHECKPOINT_RESTART
        )
        await rt.send(agent.id, "Migrate the test suite to pytest.")

``model.py`` says how requests map onto SDK queries, ``_reading.py`` how occupancy is read from
the SDK's messages, ``archive.py`` how a session's transcript is kept before the SDK compacts it.
"""

from __future__ import annotations

from segue.agent_sdk.archive import archive_transcript
from segue.agent_sdk.model import CONTINUE_PROMPT, AgentSdkModel

__all__ = ["CONTINUE_PROMPT", "AgentSdkModel", "archive_transcript"]

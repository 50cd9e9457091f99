"""How an agent talks: the prompt it is given and how its reply is parsed into an action."""

from turnrl.agent.parsing import ParsedAction, parse_action
from turnrl.agent.prompting import PromptConfig, agent_view, format_turn, system_message

__all__ = ["ParsedAction", "PromptConfig", "agent_view", "format_turn", "parse_action", "system_message"]

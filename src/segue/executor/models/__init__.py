"""Model adapters: segue's ``LlmModel`` port over a provider (``AnthropicModel``) or a script
(``ScriptedModel``, offline and deterministic, for the demo and tests)."""

"""Tool calling on chat completions, as OpenAI defines it.

- request.py: `tools`, `tool_choice` and `parallel_tool_calls` checked into a ToolRequest.
- formats.py: each model family's call format (SmolLM2, Hermes, Llama 3.1 JSON) in a registry: how
  calls are written (the grammar that constrains `required` and named calls), parsed (`auto`), and
  shown to a template that does not render tools itself.
- prompt.py: the conversation as the chat template gets it (tool calls and results in the history).
- results.py: a choice's text turned into OpenAI's message and streamed deltas; live_calls.py streams
  constrained calls as they are generated.
- plan.py: the above tied together for one request.
"""

"""OpenAI tools in a request: checked, handed to the chat template, and enforced by a
grammar where the client requires a call.

``tool_choice``: ``auto`` (the default with tools) lets the model answer or call;
``none`` renders no tools, so the model answers in text; ``required`` and a named
function (``{"type": "function", "function": {"name": …}}``) constrain the answer with a
grammar built from the tools' parameter schemas, in the call format the model's template
teaches (``edgespec.server.toolcalls``), so the answer is always a well-formed call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgespec.decoding.grammar import GrammarError, GrammarSpec, compile_grammar, schema_grammar
from edgespec.server.errors import bad_request
from edgespec.server.toolcalls import detect_format

_CALL_RULE = "call"


@dataclass(frozen=True)
class ToolSetup:
    tools: list[dict[str, Any]] | None = None  # what the template renders (None: no tools)
    names: frozenset[str] = frozenset()  # functions a call may name
    format: str = "none"  # the model's call format (toolcalls.FORMATS)
    grammar: GrammarSpec | None = None  # where a call is required
    parallel: bool = True
    choice: str = "none"
    schemas: dict[str, Any] = field(default_factory=dict)


def _function(tool: Any, index: int) -> tuple[str, dict[str, Any]]:
    param = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise bad_request(f"'{param}' must be {{'type': 'function', 'function': {{...}}}}", "tools")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise bad_request(f"'{param}.function' must be an object with a 'name'", "tools")
    name = function.get("name")
    if not isinstance(name, str) or not name or len(name) > 128:
        raise bad_request(f"'{param}.function.name' must be a non-empty string", "tools")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise bad_request(f"'{param}.function.parameters' must be a JSON schema object", "tools")
    return name, parameters


def parse_tools(body: dict, chat_template: str | None, model_name: str) -> ToolSetup:
    """The request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return ToolSetup()
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of tools", "tools")
    schemas: dict[str, Any] = {}
    for index, tool in enumerate(tools):
        name, parameters = _function(tool, index)
        if name in schemas:
            raise bad_request(f"'tools' names the function {name!r} twice", "tools")
        schemas[name] = parameters
    fmt = detect_format(chat_template, model_name)
    names = frozenset(schemas)
    if choice is None or choice == "auto":
        return ToolSetup(tools, names, fmt, None, parallel, "auto", schemas)
    if choice == "none":
        return ToolSetup(None, names, "none", None, parallel, "none", schemas)
    if choice == "required":
        required = sorted(schemas)
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in schemas:
            raise bad_request(f"'tool_choice' names {name!r}, which is not among 'tools'", "tool_choice")
        required = [name]
    else:
        raise bad_request(
            "'tool_choice' must be 'auto', 'none', 'required' or a function: "
            "{'type': 'function', 'function': {'name': …}}",
            "tool_choice",
        )
    if fmt == "none":
        raise bad_request("this model's chat template has no tool calls to require", "tool_choice")
    grammar = call_grammar(fmt, {n: schemas[n] for n in required}, parallel)
    return ToolSetup(tools, names, fmt, grammar, parallel, "required", schemas)


def call_grammar(fmt: str, schemas: dict[str, Any], parallel: bool) -> GrammarSpec:
    """A grammar whose every answer is one call (or, with ``parallel``, one or more) to a
    function of ``schemas`` with arguments of its schema, in the model's call format."""
    key = "parameters" if fmt == "llama3" else "arguments"
    alternatives = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, key: schema or {"type": "object"}},
            "required": ["name", key],
        }
        for name, schema in schemas.items()
    ]
    call_schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    try:
        rules = schema_grammar(call_schema).replace("root ::=", f"{_CALL_RULE} ::=", 1)
    except GrammarError as exc:
        raise bad_request(f"a tool's parameters cannot be enforced: {exc}", "tools") from None
    if fmt == "hermes":
        one = f'"<tool_call>\\n" {_CALL_RULE} "\\n</tool_call>"'
        root = f'{one} ("\\n" {one})*' if parallel else one
    elif fmt == "mistral":
        root = (
            f'"[TOOL_CALLS][" {_CALL_RULE} ("," {_CALL_RULE})* "]"'
            if parallel
            else (f'"[TOOL_CALLS][" {_CALL_RULE} "]"')
        )
    else:
        root = f'{_CALL_RULE} (";" {_CALL_RULE})*' if parallel else _CALL_RULE
    try:
        return compile_grammar(f"root ::= {root}\n{rules}")
    except GrammarError as exc:
        raise bad_request(f"the tools cannot be enforced with a grammar: {exc}", "tool_choice") from None

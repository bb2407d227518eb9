"""Independent reference for tpu::ChatTemplate: renders a tokenizer_config.json's chat template with
Jinja2 (Debian's python3-jinja2) in the environment Transformers' apply_chat_template builds:
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension, a
no-op {% generation %} tag, raise_exception, strftime_now and Transformers' tojson filter; the
special tokens of the config (strings or AddedToken objects) are passed as variables."""
import json
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: renders its body (Transformers tracks assistant spans)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


SPECIAL = ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"]


def _token(t):
    return t["content"] if isinstance(t, dict) else t


def render(config, case):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    src = config["chat_template"]
    if isinstance(src, list):
        src = next(t["template"] for t in src if t["name"] == "default")
    kwargs = {k: _token(config[k]) for k in SPECIAL if config.get(k) is not None}
    if isinstance(config.get("additional_special_tokens"), list):
        kwargs["additional_special_tokens"] = [_token(t) for t in config["additional_special_tokens"]]
    kwargs.update(case.get("extra", {}))
    return env.from_string(src).render(messages=case["messages"], tools=case.get("tools"),
                                       documents=case.get("documents"),
                                       add_generation_prompt=case.get("add_generation_prompt", False), **kwargs)

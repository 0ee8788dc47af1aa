"""How a question is asked of a causal language model: the prompt's text in each ``extract.prompt`` style, in the
model's chat template when it has one (else as plain text), rendered once per tokenizer and style in a child process
bounded in time and memory (:func:`checked_template`): a chat template is code from the model folder.

The data never passes through the template: the text and the question are placed between the rendered pieces
(:func:`attnclust.models.prompting.encode_prompt`).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from typing import Any

from ..errors import DataError, ModelError

__all__ = ["EXAMPLE", "NO_ANSWER", "SYSTEM", "TEMPLATE_MEMORY", "TEMPLATE_SECONDS", "checked_template",
           "render_prompt", "user_turn"]

NO_ANSWER = "unanswerable"
_SHORT = ("Answer the question about the text with the shortest phrase copied exactly from the text, at most five "
          f"words. If the text does not contain the answer, reply: {NO_ANSWER}")
SYSTEM = {
    "plain": f"Answer the question using words from the text. If the text does not answer it, reply: {NO_ANSWER}",
    "short": _SHORT,
    "example": _SHORT,
}
"""The instruction of each ``extract.prompt`` style."""
EXAMPLE = ("The lighthouse at Kell Point was built in 1871 by the harbour board. Its lamp burned whale oil until "
           "1903, when it was converted to paraffin.", "What did the lamp burn before 1903?", "whale oil")
"""The worked example (context, question, answer) of the ``example`` style: a text of our own."""
_CTX, _QST = "\x00attnclust-context\x00", "\x00attnclust-question\x00"  # placeholders while the template renders


def _user_text(context: str, question: str) -> str:
    return f"Text: {context}\n\nQuestion: {question}"


def render_prompt(tokenizer: Any, style: str, context: str = _CTX, question: str = _QST) -> str:
    """The prompt as text: the chat template's rendering (generation prompt added) or, without a template,
    ``instruction / Text: / Question: / Answer:`` lines.

    Parameters
    ----------
    tokenizer
        The model's tokenizer (its ``chat_template``, if any).
    style
        ``plain``, ``short`` or ``example`` (``extract.prompt``).
    context, question
        The texts to place.
    """
    if style not in SYSTEM:
        raise DataError(f"extract.prompt {style!r}: unknown; allowed: {' | '.join(SYSTEM)}")
    system = SYSTEM[style]
    shots = [EXAMPLE] if style == "example" else []
    if getattr(tokenizer, "chat_template", None):
        messages = [] if style == "plain" else [{"role": "system", "content": system}]
        for ex_context, ex_question, ex_answer in shots:
            messages += [{"role": "user", "content": _user_text(ex_context, ex_question)},
                         {"role": "assistant", "content": ex_answer}]
        ask = _user_text(context, question)
        messages.append({"role": "user", "content": f"{system}\n\n{ask}" if style == "plain" else ask})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    lines = [system, ""]
    for ex_context, ex_question, ex_answer in shots:
        lines += [f"Text: {ex_context}", f"Question: {ex_question}", f"Answer: {ex_answer}", ""]
    return "\n".join([*lines, f"Text: {context}", f"Question: {question}", "Answer:"])


TEMPLATE_SECONDS = 10.0
"""The longest a model's chat template may take to render one prompt (a few milliseconds for a real one)."""
TEMPLATE_MEMORY = 2 << 30
"""The most memory (bytes, beyond what the process already maps) a chat template may take to render."""
_TEMPLATES: dict[tuple, str] = {}


def checked_template(tokenizer: Any, style: str) -> str:
    """:func:`render_prompt` with the placeholders, rendered once per tokenizer and style in a forked child
    bounded in time (:data:`TEMPLATE_SECONDS`) and memory (:data:`TEMPLATE_MEMORY`).

    A chat template is code from the model folder: transformers renders it in Jinja's sandbox (no file or
    attribute access), but a template can still raise, loop for hours or build a string of gigabytes. Each of
    these is one line here. The data never passes through the template (it is placed between the rendered
    pieces), so one bounded rendering covers every prompt.

    Raises
    ------
    ModelError
        The template raised, did not finish in time, or ran out of memory.
    """
    key = (id(tokenizer), getattr(tokenizer, "chat_template", None), str(getattr(tokenizer, "bos_token", None)),
           str(getattr(tokenizer, "eos_token", None)), style)
    if key not in _TEMPLATES:
        if not getattr(tokenizer, "chat_template", None) or not hasattr(os, "fork"):
            _TEMPLATES[key] = _render_or_fail(tokenizer, style)
        else:
            _TEMPLATES[key] = _render_in_child(tokenizer, style)
    return _TEMPLATES[key]


def user_turn(tokenizer: Any) -> tuple[str, str]:
    """The chat template's text before and after the content of one lone user message, generation prompt added
    (``("", "")`` without a template): a prompt of one's own wording in the model's chat format (the
    needle-in-a-haystack test's, :mod:`attnclust.analysis.needle`), cut from the one bounded rendering of the
    ``plain`` style (:func:`checked_template`), whose only message is the user's.

    Raises
    ------
    DataError
        The template does not show the message's content once, as given.
    """
    if not getattr(tokenizer, "chat_template", None):
        return "", ""
    content = f"{SYSTEM['plain']}\n\n{_user_text(_CTX, _QST)}"
    rendered = checked_template(tokenizer, "plain")
    if rendered.count(content) != 1:
        raise DataError("the model's chat template does not show a user message's content once, as given; use a "
                        "model whose template shows message contents as given")
    head, tail = rendered.split(content)
    return head, tail


def _template_error(tokenizer: Any, what: str) -> ModelError:
    name = getattr(tokenizer, "name_or_path", "") or "the model"
    return ModelError(f"model.name {name!r}: its chat template {what}; fix or remove chat_template.jinja (or "
                      f"'chat_template' in tokenizer_config.json), or use another model")


def _render_or_fail(tokenizer: Any, style: str) -> str:
    try:
        return render_prompt(tokenizer, style)
    except (DataError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - Jinja raises TemplateError, UndefinedError, TypeError, ...
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise _template_error(tokenizer, f"fails to render ({type(exc).__name__}{': ' + first if first else ''})") \
            from None


def _render_in_child(tokenizer: Any, style: str) -> str:
    import resource  # Unix only, as fork is

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: render, send the result (or the error line) back, exit without cleanup
        code = 0
        try:
            os.close(read)
            with open("/proc/self/statm") as fh:
                mapped = int(fh.read().split()[0]) * resource.getpagesize()
            resource.setrlimit(resource.RLIMIT_AS, (mapped + TEMPLATE_MEMORY, mapped + TEMPLATE_MEMORY))
            try:
                result = ("ok", _render_or_fail(tokenizer, style))
            except MemoryError:
                result = ("error", f"needs more than {TEMPLATE_MEMORY >> 30} GiB of memory to render")
            except (ModelError, DataError) as exc:
                result = ("raise", type(exc).__name__, str(exc))
            with os.fdopen(write, "wb") as fh:
                pickle.dump(result, fh)
        except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the caller
            code = 1
        os._exit(code)
    os.close(write)
    chunks, deadline = [], time.monotonic() + TEMPLATE_SECONDS
    with os.fdopen(read, "rb") as fh:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fh], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise _template_error(tokenizer, f"did not finish rendering in {TEMPLATE_SECONDS:g} s (a loop "
                                                 f"without bound?)")
            block = os.read(fh.fileno(), 1 << 16)
            if not block:
                break
            chunks.append(block)
    os.waitpid(pid, 0)
    try:
        result = pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 - the child died before it could answer
        raise _template_error(tokenizer, "ended the process that rendered it") from None
    if result[0] == "raise":
        raise (ModelError if result[1] == "ModelError" else DataError)(result[2])
    if result[0] == "error":
        raise _template_error(tokenizer, result[1])
    return result[1]

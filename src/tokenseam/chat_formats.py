"""The chat templates built in: for a GGUF that carries none, and for `tokenseam serve --chat-template NAME`.
Kept apart from the engine, so the linter and the planner read them without llama.cpp."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .vocab import Vocabulary

# Used only when a GGUF carries no template (`fallback_template`), or when the server is told to
# (`tokenseam serve --chat-template`).
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma's turns: `<start_of_turn>ROLE\n ... <end_of_turn>\n`, the assistant's role named `model`. Gemma has
# no system role: system text opens the next user turn (or is a user turn of its own when no user message
# follows it), separated by a blank line.
GEMMA_TURNS = (
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = ns.system + message['content'] + '\n\n' %}"
    "{% else %}"
    "{% if ns.system and message['role'] != 'user' %}"
    "{{ '<start_of_turn>user\n' + ns.system[:-2] + '<end_of_turn>\n' }}{% set ns.system = '' %}{% endif %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{% if message['role'] == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{{ message['content'] + '<end_of_turn>\n' }}"
    "{% endif %}{% endfor %}"
    "{% if ns.system %}{{ '<start_of_turn>user\n' + ns.system[:-2] + '<end_of_turn>\n' }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# The templates `--chat-template` names, and the turn markers that pick one for a GGUF without a template.
BUILT_IN = {"chatml": CHATML, "gemma": GEMMA_TURNS}
_MARKERS = {"chatml": ("<|im_start|>", "<|im_end|>"), "gemma": ("<start_of_turn>", "<end_of_turn>")}


def fallback_template(vocab: Vocabulary) -> str:
    """The built-in template (its BUILT_IN name) for a model whose GGUF carries none: the one whose turn markers
    are special tokens of the vocabulary, so that a turn ends with the model's own end token and the markers
    are single tokens, not text (ChatML's on a Gemma vocabulary is ten tokens of plain text per turn); ChatML
    when neither or both are."""
    specials = {vocab.token_text[i] for i in range(vocab.size) if vocab.is_special[i]}
    found = [name for name, marks in _MARKERS.items() if all(m in specials for m in marks)]
    return found[0] if len(found) == 1 else "chatml"

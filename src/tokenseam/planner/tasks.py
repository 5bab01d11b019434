"""Exact-match task sets for paired prompt evaluation: a seeded generator, a loader, answer extraction and scoring.

Four groups (arithmetic, sorting, word extraction, reading comprehension), each item with one exact answer.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path

from .errors import PlannerError
from .inputs import read_jsonl

GROUPS = ("arithmetic", "sorting", "word_extraction", "reading_comprehension")
MAX_TASKS = 100_000
MAX_TASKS_BYTES = 64 * 1024 * 1024

_WORDS = (
    "apple",
    "river",
    "candle",
    "mirror",
    "garden",
    "pencil",
    "window",
    "forest",
    "ladder",
    "button",
    "castle",
    "feather",
    "island",
    "jacket",
    "kettle",
    "lantern",
    "marble",
    "needle",
    "orange",
    "pillow",
    "quilt",
    "rocket",
    "saddle",
    "tunnel",
    "violin",
    "wagon",
    "yarn",
    "zipper",
    "anchor",
    "bottle",
    "cactus",
    "dragon",
    "engine",
    "falcon",
    "guitar",
    "hammer",
    "igloo",
    "jungle",
    "koala",
    "lemon",
    "magnet",
    "nectar",
    "oyster",
    "parrot",
    "quartz",
    "ribbon",
    "spider",
    "tomato",
    "umbrella",
    "velvet",
)
_SYLLABLES = (
    "ka",
    "vo",
    "ren",
    "thi",
    "mal",
    "dor",
    "quo",
    "sel",
    "bri",
    "zan",
    "lu",
    "fen",
    "oth",
    "gra",
    "pim",
    "tes",
    "wyn",
    "cal",
    "dru",
    "ny",
    "xer",
    "bel",
    "sha",
    "tor",
)
_JOBS = (
    "baker",
    "glassblower",
    "ferryman",
    "beekeeper",
    "cartographer",
    "weaver",
    "blacksmith",
    "astronomer",
    "potter",
    "clockmaker",
    "herbalist",
    "lamplighter",
)
_ANIMALS = ("goats", "geese", "llamas", "ferrets", "pigeons", "alpacas", "rabbits", "tortoises")
_ORDINALS = ("first", "second", "third", "fourth", "fifth")


@dataclass(frozen=True)
class Task:
    id: str
    group: str
    input: str
    answer: str

    def to_dict(self) -> dict:
        return asdict(self)


def _name(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(12, 99), rng.randint(3, 29)
        return f"Compute {a} * {b}. Reply with the number only.", str(a * b)
    a, b = rng.randint(100, 999), rng.randint(10, 999)
    return f"Compute {a} {op} {b}. Reply with the number only.", str(a + b if op == "+" else a - b)


def _sorting(rng: random.Random) -> tuple[str, str]:
    k = rng.randint(4, 7)
    if rng.random() < 0.5:
        nums = rng.sample(range(1, 1000), k)
        return (
            f"Sort these numbers from smallest to largest: {', '.join(map(str, nums))}. "
            "Reply with the sorted list, separated by commas.",
            ", ".join(map(str, sorted(nums))),
        )
    words = rng.sample(_WORDS, k)
    return (
        f"Sort these words alphabetically: {', '.join(words)}. Reply with the sorted list, separated by commas.",
        ", ".join(sorted(words)),
    )


def _word_extraction(rng: random.Random) -> tuple[str, str]:
    words = rng.sample(_WORDS, rng.randint(6, 9))
    sentence = " ".join(words)
    kind = rng.randrange(3)
    if kind == 0:
        i = rng.randrange(len(_ORDINALS))
        q = f'What is the {_ORDINALS[i]} word of this list: "{sentence}"? Reply with the word only.'
        return q, words[i]
    if kind == 1:
        return f'What is the last word of this list: "{sentence}"? Reply with the word only.', words[-1]
    target = rng.choice(words)
    others = [w for w in words if w != target and w[0] != target[0]]
    shown = rng.sample(others, min(len(others), 5)) + [target]
    rng.shuffle(shown)
    return (
        f'Which word in this list starts with the letter "{target[0]}": {", ".join(shown)}? '
        "Reply with the word only.",
        target,
    )


def _reading(rng: random.Random) -> tuple[str, str]:
    people = []
    used: set[str] = set()  # first names: questions refer to people by first name
    while len(people) < 3:
        first = _name(rng, 2)
        n = f"{first} {_name(rng, 3)}"
        if first not in used:
            used.add(first)
            people.append(
                {
                    "name": n,
                    "town": _name(rng, 3),
                    "job": rng.choice(_JOBS),
                    "animals": rng.choice(_ANIMALS),
                    "count": rng.randint(3, 97),
                    "year": rng.randint(1720, 1990),
                }
            )
    sentences = []
    for p in people:
        sentences.append(f"{p['name']} works as a {p['job']} in the town of {p['town']}.")
        sentences.append(f"Since {p['year']}, {p['name'].split()[0]} has kept {p['count']} {p['animals']}.")
    rng.shuffle(sentences)
    p = rng.choice(people)
    first = p["name"].split()[0]
    q, a = rng.choice(
        [
            (f"How many {p['animals']} does {first} keep?", str(p["count"])),
            (f"In which town does {p['name']} work?", p["town"]),
            (f"What is {p['name']}'s job?", p["job"]),
            (f"Since which year has {first} kept {p['animals']}?", str(p["year"])),
        ]
    )
    return (
        f"Read the passage and answer the question.\n\nPassage: {' '.join(sentences)}\n\nQuestion: {q} "
        "Reply with the answer only.",
        a,
    )


_MAKERS = {
    "arithmetic": _arithmetic,
    "sorting": _sorting,
    "word_extraction": _word_extraction,
    "reading_comprehension": _reading,
}


def make_tasks(n: int = 500, seed: int = 0) -> list[Task]:
    """A reproducible task set: n items split evenly over the four groups, interleaved so any prefix is mixed.

    Each group draws from its own `random.Random` seeded from (seed, group), so the items of one group do not
    depend on how many items the other groups have."""
    if n < 1:
        raise PlannerError("the task set needs at least one item (--n >= 1)")
    if n > MAX_TASKS:
        raise PlannerError(f"at most {MAX_TASKS:,} tasks (--n)")
    rngs = {g: random.Random(f"tokenseam-tasks:{seed}:{g}") for g in GROUPS}
    counters = dict.fromkeys(GROUPS, 0)
    out = []
    for i in range(n):
        g = GROUPS[i % len(GROUPS)]
        counters[g] += 1
        text, answer = _MAKERS[g](rngs[g])
        out.append(Task(f"{g}-{counters[g]:04d}", g, text, answer))
    return out


def write_tasks(tasks: list[Task], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks from JSONL: {"id", "input", "answer"} and optional "group" (default "all"); ids must be unique."""
    tasks, seen = [], set()
    p = Path(path)
    for p, n, obj in read_jsonl(path, "tasks", MAX_TASKS_BYTES):
        if not isinstance(obj, dict):
            raise PlannerError(f"{p} line {n}: expected an object with id, input, answer")
        for f in ("id", "input", "answer"):
            if not isinstance(obj.get(f), str) or (f != "answer" and not obj[f]):
                raise PlannerError(f"{p} line {n}: field {f!r} must be a non-empty string")
        group = obj.get("group", "all")
        if not isinstance(group, str) or not group:
            raise PlannerError(f"{p} line {n}: field 'group' must be a non-empty string")
        if obj["id"] in seen:
            raise PlannerError(f"{p} line {n}: duplicate id {obj['id']!r}")
        seen.add(obj["id"])
        tasks.append(Task(obj["id"], group, obj["input"], obj["answer"]))
        if len(tasks) > MAX_TASKS:
            raise PlannerError(f"{p} has more than {MAX_TASKS:,} tasks")
    if not tasks:
        raise PlannerError(f"tasks file {p} holds no tasks")
    return tasks


_ANSWER_MARK = re.compile(r"(?i)\banswer\s*(?:is\s*[:：]?|[:：])")
_EDGE = " \t\"'`*_.,;:!?()[]{}<>"
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d+)?$")


def extract_answer(output: str) -> str:
    """The answer part of a model output: the text after the last "Answer:" / "answer is" if present, then its first non-empty
    line, without surrounding quotes, markdown emphasis or final punctuation."""
    text = output or ""
    marks = list(_ANSWER_MARK.finditer(text))
    if marks:
        text = text[marks[-1].end() :]
    for line in text.splitlines():
        if line.strip():
            return line.strip().strip(_EDGE).strip()
    return ""


def normalize(text: str, as_list: bool = False) -> str:
    """Comparison form: NFKC, case-folded, single spaces, edges stripped of quotes/punctuation; numbers lose
    thousands separators, a leading '+' and a zero fraction ('1,200.0' -> '1200'); lists are split on commas
    and rejoined as 'a, b, c' (used when the gold answer is a comma-separated list)."""
    t = unicodedata.normalize("NFKC", text).casefold().replace("\u2212", "-")
    t = " ".join(t.split()).strip(_EDGE)
    if as_list:
        return ", ".join(normalize(x) for x in re.split(r"\s*,\s*|\s+and\s+", t) if x.strip(_EDGE))
    if _THOUSANDS.match(t):
        t = t.replace(",", "")
    if re.fullmatch(r"[-+]?\d+(\.\d+)?", t):
        t = format(Decimal(t).normalize(), "f")
        if t == "-0":
            t = "0"
    return t


def is_correct(output: str, answer: str) -> bool:
    """Exact match after `extract_answer` and `normalize` (list-aware when the gold answer holds a comma)."""
    as_list = "," in answer and not _THOUSANDS.match(answer.strip())
    return normalize(extract_answer(output), as_list) == normalize(answer, as_list)

"""The boundary set: prefix | continuation pairs whose seam splits what would be one token, plus stable prompts.

The tests assert on it and `tokenseam bench healing` measures on it, so it lives in the package.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BoundaryCase:
    category: str
    prefix: str
    continuation: str

    @property
    def joined(self) -> str:
        return self.prefix + self.continuation


BOUNDARY_CASES: tuple[BoundaryCase, ...] = tuple(
    BoundaryCase(c, p, q)
    for c, p, q in [
        ("url", "http:", "//"),
        ("url", '"http', "s://"),
        ("url", 'See <a href="http:', "//example.com"),
        ("url", "https://www.", "example.com"),
        ("whitespace", "about ", "the"),
        ("whitespace", "Answer:", "\n\n"),
        ("whitespace", "def f():\n    ", "return"),
        ("whitespace", "Question: why?\n", "\nAnswer"),
        ("code", "def calculate_", "total"),
        ("code", "self.max_", "new_tokens"),
        ("code", "import num", "py"),
        ("code", "for i in range(", "10):"),
        ("cjk", "中华人民共和", "国"),
        ("cjk", "使用Py", "thon"),
        ("cjk", "東京", "都庁"),
        ("latex", "\\alp", "ha"),
        ("latex", "\\frac{", "a}{b}"),
        ("latex", "$\\math", "bb{R}$"),
        ("midword", "Thr", "ee"),
        ("midword", "Fran", "ce"),
        ("midword", "The capital of Fran", "ce is Paris."),
    ]
)

# Prompts whose end no continuation re-tokenizes on either bundled model: they end on a digit, and both
# tokenizers split digits into single-digit tokens that nothing merges with.
STABLE_PROMPTS: tuple[str, ...] = (
    "The year was 1984",
    "x = 3",
    "Answer: 4",
    "Items: 1",
    "Result 7",
)

# 50 different texts a RAG system might append after a fixed header (each starts differently on purpose).
_CHUNK_STARTS = (
    "The",
    "In 2019,",
    "Paris",
    "def main():",
    "# Title",
    "- item",
    "1. First",
    "中文文本",
    "東京都",
    '"Quoted',
    "(see above)",
    "https://example.com",
    "  indented",
    "\nblank first",
    "α-helix",
    "$E=mc^2$",
    "\\section{Intro}",
    "Über",
    "née",
    "SELECT *",
    '{"a": 1}',
    "<div>",
    "...",
    "?",
    "!",
    "42 is",
    "0x1F",
    "_private",
    "CamelCase",
    "snake_case",
    "ALLCAPS",
    "'single'",
    "`code`",
    "@user",
    "#tag",
    "~tilde",
    "|pipe|",
    "&amp;",
    "%d",
    "*bold*",
    "> quote",
    "\ttab",
    "\r\nCRLF",
    "😀 emoji",
    "한국어",
    "Ωmega",
    "ßtraße",
    "año",
    "x",
    " leading space",
)
RAG_CHUNKS: tuple[str, ...] = tuple(s + " and some more text follows here." for s in _CHUNK_STARTS)

# Fixed prompt heads of a RAG workload; each is followed by one of RAG_CHUNKS.
RAG_FIXED_PROMPTS: tuple[str, ...] = (
    "You answer questions using only the documents provided.\n\nContext:\n",
    "Read the passage and answer the question in one word.\nAnswer: ",
    "Complete the following Python module.\n```python\n",
    "以下是参考资料，请根据资料回答问题。资料如下：",
)

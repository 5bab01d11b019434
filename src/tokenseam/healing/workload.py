"""A few hundred realistic prompt/continuation pairs for the healing benchmark, built deterministically.

Stems (instructions, documents, code, CJK) times prompt endings people actually write ("Answer:", "```python\n").
"""

from __future__ import annotations

STEMS = (
    "Summarize the following article in two sentences.",
    "You are a helpful assistant. Answer the user's question concisely.",
    "Translate the sentence into French: The weather is nice today.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Q: What is the capital of Australia?",
    "Extract the dates mentioned in this email: we met on 3 May and again on 17 June.",
    "The mitochondria is the powerhouse of the cell. Explain why.",
    "请用一句话解释什么是机器学习。",
    "東京の人口はどのくらいですか？",
    "Classify the sentiment of this review: I loved the food but the service was slow.",
    'Given the JSON {"name": "Ada", "born": 1815}, list the keys.',
    "Rewrite this SQL to use a JOIN: SELECT * FROM a WHERE id IN (SELECT a_id FROM b)",
    "Prove that the square root of 2 is irrational. Use $\\sqrt{2} = p/q$.",
    "Documentation for the requests library lives at",
    "Fix the bug: for i in range(len(xs)): print(xs[i+1])",
    "Product description: lightweight waterproof hiking boots with ankle support.",
    "Chapter 1\n\nIt was a bright cold day in April, and the clocks were striking thirteen.",
    "List three uses of the HTTP header Cache-Control.",
    'def tokenize(text: str) -> list[str]:\n    """Split text into words."""',
    "Meeting notes (2024-05-02): budget approved; hiring paused; next review in Q3.",
)

ENDINGS = (
    "",
    "\n",
    "\n\n",
    " ",
    "\nAnswer:",
    "\nAnswer: ",
    "\nA:",
    "\n```python\n",
    "\n\ndef ",
    "\nTranslation:",
    "\n回答：",
    "\nSource: http://",
    "\n1.",
    "\n- ",
    "\nSummary:\n",
)

CONTINUATIONS = (
    "The answer is 42.",
    " Yes, it is.",
    "\nFirst, consider the input.",
    "import os\n",
    "Canberra.",
    "//docs.python-requests.org",
    "1. Cache responses",
    "机器学习是一种方法。",
    "約1400万人です。",
    " positive",
    "$p^2 = 2q^2$",
    "return [w for w in text.split()]",
    "    print(xs[i])",
    "\n\nThe end.",
    "Le temps est beau.",
)


def realistic_pairs() -> list[tuple[str, str]]:
    """300 (prompt, continuation) pairs: every stem with every ending, continuations cycled."""
    out = []
    k = 0
    for stem in STEMS:
        for end in ENDINGS:
            out.append((stem + end, CONTINUATIONS[k % len(CONTINUATIONS)]))
            k += 1
    return out

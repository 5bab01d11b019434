"""Benchmarks (`tokenseam bench ...`): each compares tokenseam with named anchors in the same run.

They print a table, write JSON (and a PNG where a picture reads better), and report medians and ratios.
"""

"""Symbolic analysis: ordering, column etree, fronts, staircase, assembly maps, counts, staging."""

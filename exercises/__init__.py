"""Problem sets that turn mathrl's files into coursework (docs/course.md).

Each exercise is a file with a function to write: its signature, a docstring with the equation and a
hint, and `raise NotImplementedError`. `python -m exercises.check 1.1` checks yours against the
project's own function and says what is wrong in words. PS4's exercises are files instead: an
algorithm file with one bug planted in it, to find from the symptom in its logs
(`python -m exercises.bug`).
"""

"""The rules a graded output is judged by: the suite's checks, the eval harnesses' scorers, an external
grader process."""

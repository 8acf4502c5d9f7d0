"""Small inspect_ai tasks for flakecheck's recipe (docs/import.md): eight short questions, a system prompt, one
generation; `quick` is graded by inspect's includes() scorer (which flakecheck maps to a check), `quick_word`
by a custom scorer (which it cannot map: a replay grades it through --grader, see grade_target_word.py)."""

import re

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, includes, scorer
from inspect_ai.solver import TaskState, generate, system_message

QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is 2 + 3?", "5"),
    ("What color is the sky on a clear day?", "blue"),
    ("How many legs does a spider have?", "8"),
    ("What is the largest planet in the solar system?", "Jupiter"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("What is the boiling point of water in degrees Celsius?", "100"),
    ("Which gas do plants absorb from the air?", "carbon dioxide"),
]


def _task(grader: object) -> Task:
    return Task(
        dataset=[Sample(input=q, target=a, id=f"q{i}") for i, (q, a) in enumerate(QUESTIONS, 1)],
        solver=[system_message("Answer in one short sentence."), generate()],
        scorer=grader,
    )


@task
def quick() -> Task:
    return _task(includes())


@scorer(metrics=[accuracy()])
def target_word():  # the target as a whole word, ignoring case: "8" passes "8 legs", not "18 legs"
    async def score(state: TaskState, target: Target) -> Score:
        found = any(re.search(rf"\b{re.escape(t)}\b", state.output.completion, re.IGNORECASE) for t in target)
        return Score(value=CORRECT if found else INCORRECT, answer=state.output.completion)

    return score


@task
def quick_word() -> Task:
    return _task(target_word())

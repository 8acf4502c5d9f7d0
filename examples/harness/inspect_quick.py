"""A small inspect_ai task for flakecheck's recipe (docs/import.md): eight short questions, a system prompt,
one generation, graded by inspect's includes() scorer."""

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, system_message

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


@task
def quick() -> Task:
    return Task(
        dataset=[Sample(input=q, target=a, id=f"q{i}") for i, (q, a) in enumerate(QUESTIONS, 1)],
        solver=[system_message("Answer in one short sentence."), generate()],
        scorer=includes(),
    )

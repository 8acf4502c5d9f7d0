"""A --grader for the replay of an imported suite whose scorer flakecheck does not map: the same rule as the
custom `target_word` scorer in inspect_quick.py (the target as a whole word, ignoring case). flakecheck sends
one JSON object per line (case_id, composition, output, target, metadata) and reads one verdict per line back.
The import kept the harness's target in metadata.target, since only a mapped scorer makes checks of it.

    flakecheck run word.jsonl --grader "python3 examples/harness/grade_target_word.py"
"""

import json
import re
import sys

for line in sys.stdin:
    request = json.loads(line)
    target = request["metadata"].get("target", request["target"])
    targets = target if isinstance(target, list) else [target]
    passed = any(re.search(rf"\b{re.escape(t)}\b", request["output"], re.IGNORECASE) for t in targets if t)
    print(json.dumps({"case_id": request["case_id"], "composition": request["composition"], "passed": passed}),
          flush=True)

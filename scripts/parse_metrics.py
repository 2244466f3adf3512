"""Parse a Prometheus text page with the official client's parser and print it as JSON.

    python scripts/parse_metrics.py < page.txt

Prints {"families": {name: {"type": ..., "help": ..., "samples": [{"name", "labels",
"value"}]}}}. A page the parser rejects exits 1 with its error: the tests use this to
check that `learner --metrics-addr` and `actor --metrics-addr` serve what Prometheus
itself reads.
"""

import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def main() -> int:
    text = sys.stdin.read()
    try:
        families = {}
        for fam in text_string_to_metric_families(text):
            families[fam.name] = {
                "type": fam.type,
                "help": fam.documentation,
                "samples": [
                    {
                        "name": s.name,
                        "labels": dict(s.labels),
                        # JSON has no NaN: say it in words.
                        "value": "NaN" if math.isnan(s.value) else s.value,
                    }
                    for s in fam.samples
                ],
            }
    except Exception as e:  # the parser raises ValueError and others
        print(f"error: the page does not parse: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"families": families}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Print this process's environment as one JSON object."""

import json
import os

print(json.dumps(dict(os.environ)))

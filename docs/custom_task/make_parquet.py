"""Write the Parquet file of docs/custom_task/README.md's own-Parquet example (300 rows).

    python docs/custom_task/make_parquet.py [PATH]    (default: within.parquet beside this file)

Columns: `question` (a two-digit addition, "23+45="), `answer` (its sum, as text) and
`tolerance` (an integer, 0 to 2: how far from the answer a completion may land and still score,
read by the reward in within.py). Your own file needs only the columns your config and reward
name; any Parquet file with them will do.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def main(path: Path) -> None:
    rng = random.Random(0)
    pairs = [(rng.randint(10, 49), rng.randint(10, 49)) for _ in range(300)]
    table = pa.table(
        {
            "question": [f"{a}+{b}=" for a, b in pairs],
            "answer": [str(a + b) for a, b in pairs],
            "tolerance": [rng.randint(0, 2) for _ in pairs],
        }
    )
    pq.write_table(table, path)
    print(f"wrote {table.num_rows} rows to {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("within.parquet"))

"""The README's two set-up commands: print them, or check that a CI script runs them verbatim.

    python3 .ci/readme_commands.py              # the main job's command, then the tests' command
    python3 .ci/readme_commands.py --check .ci/run

The main job ends in `streamlit run app.py`, which serves until stopped; CI runs the same line
with that step replaced by `python .ci/app_smoke.py`.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVE = "streamlit run app.py"
SMOKE = "python .ci/app_smoke.py"


def readme_commands() -> tuple[str, str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    if len(blocks) < 2:
        sys.exit("README.md: expected the main job and the test command as its first two ```bash blocks")
    main, tests = (b.strip() for b in blocks[:2])
    if "\n" in main or "\n" in tests or not main.endswith(SERVE):
        sys.exit(f"README.md: each set-up command is one line, and the main job ends in `{SERVE}`")
    return main, tests


def main() -> None:
    main_cmd, test_cmd = readme_commands()
    ci_cmd = main_cmd[: -len(SERVE)] + SMOKE
    if sys.argv[1:2] != ["--check"]:
        print(main_cmd, test_cmd, sep="\n")
        return
    lines = [ln.strip() for ln in Path(sys.argv[2]).read_text().splitlines()]
    for want in (ci_cmd, test_cmd):
        if want not in lines:
            sys.exit(f"{sys.argv[2]} does not run the README's command verbatim:\n  {want}")
    if lines.index(ci_cmd) > lines.index(test_cmd):
        sys.exit(f"{sys.argv[2]} must run the main job before the tests, as the README orders them")


if __name__ == "__main__":
    main()

"""`python -m launch.cli`: the `asyncgrpo` command (what the launcher's children, torchrun's
ranks and the recipes run)."""

from launch.cli import main

if __name__ == "__main__":
    main()

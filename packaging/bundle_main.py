"""The desktop bundle's entry point: PyInstaller freezes this script into `dist/tandem/tandem`,
which then behaves as `python main.py`.

In a bundle `sys.executable` is that program, not a Python interpreter, so what the app asks of
`sys.executable` must work on it too: `tandem -c CODE ARGS` runs CODE as `python -c` would (the
Supervise page's sandbox child, app/sandbox_executor.py, starts that way), and multiprocessing's
children start through `freeze_support`.
"""
import multiprocessing
import sys


def _run_code(code: str, args: list[str]) -> None:
    sys.argv = ["-c", *args]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    multiprocessing.freeze_support()
    if getattr(sys, "frozen", False) and len(sys.argv) > 2 and sys.argv[1] == "-c":
        _run_code(sys.argv[2], sys.argv[3:])
        sys.exit(0)
    from main import main

    sys.exit(main())

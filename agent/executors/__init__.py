"""Executors: desktop (mss + pyautogui), Android (uiautomator2), terminal and files.

Importing this package imports none of the back ends (they need a display or adb)."""
from agent.executors.base import ExecutionError, Executor, Frame, encode_pixels, frame_from_image_bytes

__all__ = ["ExecutionError", "Executor", "Frame", "encode_pixels", "frame_from_image_bytes"]

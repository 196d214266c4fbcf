"""Browser games written by this project, played through the DevTools protocol under a fake clock,
scored against a scripted reference player (trainer.sandbox.games.spec says what a game is)."""

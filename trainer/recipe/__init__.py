"""The default model's recipe: the data, the stages and the settings that build it."""

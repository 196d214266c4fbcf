"""The vision-language model at run time: loading and generation, batched generation, its inputs and
the pointer head."""

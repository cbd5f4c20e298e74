"""The artifact as the runtime reads it: the manifest (the only thing it trusts), model facts, runtime options, the tokenizer, chat template and detokenizer, and the host it runs on."""

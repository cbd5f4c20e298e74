"""Next-token selection from a step's logits."""

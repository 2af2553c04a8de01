"""The rules and data both sides of the replay read: the flags and default prefill graph words
(``flags``), the models (``models``), the blocker signatures (``blame``), a captured graph's
outcome (``breakable_outcome``) and the user's plugin (``patch``, ``patch_text``)."""

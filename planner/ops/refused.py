"""Ops memplan refuses by design, with the reason a user reads in the error: a static plan gives every
tensor one shape and one place in a byte arena, before any data is seen."""

DATA_DEPENDENT = "the length of its output depends on the input's values; a static plan needs shapes known before running"
STRINGS = "strings have no place in a byte arena"
SEQUENCES = "sequences are not planned, only tensors"
OPTIONALS = "optional values are not planned, only tensors"

REASONS = {
    **dict.fromkeys(("NonZero", "Unique", "Compress"), DATA_DEPENDENT),
    **dict.fromkeys(("StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch", "TfIdfVectorizer"), STRINGS),
    "ImageDecoder": "the size of the image it decodes depends on the encoded bytes",
    **dict.fromkeys(("SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
                     "SequenceLength", "SequenceMap", "SplitToSequence", "ConcatFromSequence"), SEQUENCES),
    **dict.fromkeys(("Optional", "OptionalGetElement", "OptionalHasElement"), OPTIONALS),
}
"""Default-domain op type -> why no plan holds it (unless its inputs are constants and it folds away)."""

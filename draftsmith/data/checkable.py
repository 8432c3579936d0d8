"""Prompts with checkable answers: what a lossy rule (Judge decoding) is scored on, beside its speed.

Two kinds, both answered well by small instruction-tuned targets (SmolLM2-135M passes most): short Python functions
whose completion is executed against assert tests written here, and capitals of countries. A prompt's ``check``
says how its answer is checked (``data/checks.py``). The sets are fixed and split once: every second task is held out.
"""

from __future__ import annotations

from draftsmith.data.records import Prompt

CODE = [
    ("add(a, b) that returns the sum of a and b", "assert add(2, 3) == 5 and add(-1, 1) == 0"),
    ("is_even(n) that returns True if n is even", "assert is_even(4) and not is_even(3)"),
    ("reverse_string(s) that returns s reversed", "assert reverse_string('abc') == 'cba'"),
    ("square(x) that returns x squared", "assert square(3) == 9 and square(-2) == 4"),
    ("count_vowels(s) that returns the number of vowels in s", "assert count_vowels('hello') == 2"),
    ("multiply(a, b) that returns the product of a and b", "assert multiply(3, 4) == 12"),
    ("is_positive(n) that returns True if n is greater than zero", "assert is_positive(2) and not is_positive(-1)"),
    ("cube(x) that returns x cubed", "assert cube(2) == 8 and cube(-3) == -27"),
    ("to_upper(s) that returns s in upper case", "assert to_upper('abc') == 'ABC'"),
    ("list_sum(xs) that returns the sum of the numbers in xs", "assert list_sum([1, 2, 3]) == 6 and list_sum([]) == 0"),
    ("first_element(xs) that returns the first element of the list xs", "assert first_element([7, 8]) == 7"),
    ("last_element(xs) that returns the last element of the list xs", "assert last_element([7, 8]) == 8"),
    ("average(xs) that returns the average of the numbers in xs", "assert average([1, 2, 3]) == 2"),
    ("is_odd(n) that returns True if n is odd", "assert is_odd(3) and not is_odd(4)"),
    ("absolute(x) that returns the absolute value of x", "assert absolute(-5) == 5 and absolute(2) == 2"),
    ("subtract(a, b) that returns a minus b", "assert subtract(5, 3) == 2"),
    ("double(x) that returns x multiplied by two", "assert double(4) == 8"),
    ("string_length(s) that returns the length of the string s", "assert string_length('hello') == 5"),
    ("to_lower(s) that returns s in lower case", "assert to_lower('ABC') == 'abc'"),
    ("minimum(a, b) that returns the smaller of a and b", "assert minimum(3, 7) == 3 and minimum(9, 2) == 2"),
    ("maximum(a, b) that returns the larger of a and b", "assert maximum(3, 7) == 7 and maximum(9, 2) == 9"),
    ("is_empty(xs) that returns True if the list xs is empty", "assert is_empty([]) and not is_empty([1])"),
    ("count_words(s) that returns the number of words in the string s", "assert count_words('a b c') == 3"),
    ("factorial(n) that returns n factorial", "assert factorial(5) == 120 and factorial(0) == 1"),
    (
        "is_palindrome(s) that returns True if s reads the same backwards",
        "assert is_palindrome('aba') and not is_palindrome('ab')",
    ),
    (
        "fahrenheit_to_celsius(f) that converts a temperature from Fahrenheit to Celsius",
        "assert fahrenheit_to_celsius(212) == 100",
    ),
    ("remove_spaces(s) that returns s with all spaces removed", "assert remove_spaces('a b c') == 'abc'"),
    ("contains(xs, x) that returns True if x is in the list xs", "assert contains([1, 2], 2) and not contains([1], 3)"),
    ("sort_list(xs) that returns the list xs sorted in ascending order", "assert sort_list([3, 1, 2]) == [1, 2, 3]"),
    (
        "fibonacci(n) that returns the n-th Fibonacci number, with fibonacci(0) == 0 and fibonacci(1) == 1",
        "assert fibonacci(10) == 55",
    ),
    (
        "is_divisible(a, b) that returns True if a is divisible by b",
        "assert is_divisible(6, 3) and not is_divisible(7, 2)",
    ),
    (
        "count_occurrences(xs, x) that returns how many times x appears in the list xs",
        "assert count_occurrences([1, 2, 1], 1) == 2",
    ),
    ("power(base, exp) that returns base raised to the power exp", "assert power(2, 10) == 1024"),
    ("unique(xs) that returns the sorted list of distinct elements of xs", "assert unique([3, 1, 3, 2]) == [1, 2, 3]"),
    (
        "celsius_to_fahrenheit(c) that converts a temperature from Celsius to Fahrenheit",
        "assert celsius_to_fahrenheit(100) == 212",
    ),
    (
        "square_list(xs) that returns a list of the squares of the numbers in xs",
        "assert square_list([1, 2, 3]) == [1, 4, 9]",
    ),
    (
        "starts_with_a(s) that returns True if the string s starts with the letter a",
        "assert starts_with_a('apple') and not starts_with_a('pear')",
    ),
    ("concat(a, b) that returns the two strings a and b joined together", "assert concat('ab', 'cd') == 'abcd'"),
    ("product(xs) that returns the product of the numbers in xs", "assert product([2, 3, 4]) == 24"),
    ("sum_to(n) that returns the sum of the integers from 1 to n", "assert sum_to(4) == 10 and sum_to(1) == 1"),
]

CAPITALS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Germany", "Berlin"),
    ("Canada", "Ottawa"),
    ("Egypt", "Cairo"),
    ("Russia", "Moscow"),
    ("China", "Beijing"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Greece", "Athens"),
    ("England", "London"),
    ("Portugal", "Lisbon"),
    ("Austria", "Vienna"),
    ("Ireland", "Dublin"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"),
    ("Poland", "Warsaw"),
    ("Hungary", "Budapest"),
    ("Thailand", "Bangkok"),
    ("South Korea", "Seoul"),
    ("Argentina", "Buenos Aires"),
    ("Chile", "Santiago"),
    ("Cuba", "Havana"),
    ("Mexico", "Mexico City"),
    ("Indonesia", "Jakarta"),
    ("Iran", "Tehran"),
    ("Iraq", "Baghdad"),
    ("Belgium", "Brussels"),
    ("the Netherlands", "Amsterdam"),
    ("the Philippines", "Manila"),
    ("Vietnam", "Hanoi"),
    ("Ukraine", "Kyiv"),
    ("Colombia", "Bogot"),
    ("Venezuela", "Caracas"),
    ("Ethiopia", "Addis Ababa"),
    ("Czechia", "Prague"),
    ("Scotland", "Edinburgh"),
    ("Afghanistan", "Kabul"),
]


KINDS = {
    "code": (CODE, "Write a Python function {}.", "python", "test"),
    "capitals": (CAPITALS, "What is the capital of {}?", "contains", "answer"),
}
"""Category -> (its tasks as (question part, check value), the question's form, the check's kind and field)."""


def checkable_prompts(split: str) -> list[Prompt]:
    """The ``train`` or ``heldout`` split (every second task of each kind held out), code and capitals interleaved."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be train or heldout, got {split!r}")
    held = split == "heldout"
    by_kind = [
        [
            Prompt(
                messages=({"role": "user", "content": form.format(part)},),
                source=f"checkable:{category}",
                category=category,
                check={"kind": kind, field: value},
            )
            for i, (part, value) in enumerate(tasks)
            if (i % 2 == 1) == held
        ]
        for category, (tasks, form, kind, field) in KINDS.items()
    ]
    return [p for group in zip(*by_kind, strict=True) for p in group]

"""Hand-written prompts for the "code" task.

Read by build_prompts.py. Each category is a list of prompt strings; the
build script strips surrounding whitespace, assigns ids and splits every
category into train/test. Edit here, then re-run build_prompts.py.
"""

# Python functions and small classes specified in prose.
PY_SPEC = [
    """Write a Python function `merge_intervals(intervals)` that takes a list of closed intervals given as `(start, end)` tuples, merges every pair that overlaps or touches, and returns the merged intervals sorted by start. For example `[(5, 7), (1, 3), (2, 4)]` becomes `[(1, 4), (5, 7)]`.""",
    """Write a Python generator function `chunked(iterable, size)` that yields lists of at most `size` consecutive items from any iterable (not just lists). Raise `ValueError` if `size` is less than 1. The last chunk may be shorter.""",
    """Write a Python function `is_valid_isbn10(code: str) -> bool` that validates an ISBN-10. Hyphens and spaces should be ignored, the last character may be `X` (meaning 10), and the weighted sum `10*d1 + 9*d2 + ... + 1*d10` must be divisible by 11.""",
    """Implement `run_length_encode(s: str) -> list[tuple[str, int]]` in Python, which turns `"aaabccdddd"` into `[("a", 3), ("b", 1), ("c", 2), ("d", 4)]`, and the inverse `run_length_decode(pairs) -> str`.""",
    """Write a Python function `flatten(nested)` that flattens arbitrarily nested lists and tuples into a single flat list, but treats strings and bytes as atoms rather than iterating over their characters. Use recursion or an explicit stack, your choice.""",
    """Write a Python function `roman_to_int(s: str) -> int` that converts a Roman numeral such as `"MCMXCIV"` into an integer. Handle the subtractive pairs (IV, IX, XL, XC, CD, CM) and raise `ValueError` for characters that are not Roman digits.""",
    """Write a Python function `top_k_words(text: str, k: int) -> list[tuple[str, int]]` that returns the `k` most frequent words in `text`, case-insensitively, ignoring punctuation. Break ties alphabetically so the result is deterministic.""",
    """Implement an `LRUCache` class in Python with a fixed `capacity`, a `get(key)` method that returns `None` for missing keys, and a `put(key, value)` method that evicts the least recently used entry when full. Use `collections.OrderedDict`.""",
    """Write a Python function `parse_duration(text: str) -> int` that converts strings like `"1h30m"`, `"45s"` or `"2h5m10s"` into a total number of seconds. Units may appear at most once and in the order h, m, s; anything else should raise `ValueError`.""",
    """Write a Python function `rotate_clockwise(matrix)` that returns a new square matrix (a list of lists) rotated 90 degrees clockwise, leaving the input untouched. Include a short example in a comment.""",
    """Write a Python function `dedupe(items, key=None)` that removes duplicates from a list while preserving the order of first occurrence. If `key` is given, two items are duplicates when `key(item)` is equal. Items themselves may be unhashable, but keys are hashable.""",
    """Write a Python decorator factory `retry(times=3, exceptions=(Exception,), delay=0.0)` that re-invokes the decorated function when it raises one of `exceptions`, up to `times` attempts in total, sleeping `delay` seconds between attempts, and re-raises the last exception if every attempt fails. Preserve the wrapped function's metadata.""",
    """Write a Python context manager called `timer(label)` using `contextlib.contextmanager` that measures the wall-clock time of the `with` block with `time.perf_counter()` and prints `"<label>: 0.123s"` when the block exits, even if the block raised an exception.""",
    """Write a Python function `slugify(title: str) -> str` that produces URL slugs: lowercase, accents stripped (use `unicodedata`), any run of non-alphanumeric characters replaced by a single hyphen, and no leading or trailing hyphens. `"Héllo, Wörld!  2024"` should become `"hello-world-2024"`.""",
    """Write an iterative binary search in Python, `binary_search(arr, target)`, for a sorted list. Return the index of `target` or `-1` if it is absent. Do not use the `bisect` module.""",
    """Write a Python function `is_balanced(s: str) -> bool` that checks whether the brackets `()`, `[]` and `{}` in a string are balanced and correctly nested. Other characters should be ignored.""",
    """Write a Python function `group_anagrams(words)` that groups words that are anagrams of each other. Return a list of groups; sort the words inside each group and sort the groups by their first word so the output is stable.""",
    """Write a Python generator `moving_average(values, window)` that yields the average of each full window of `window` consecutive numbers, in O(1) work per item by keeping a running sum and a `collections.deque`.""",
    """Write a Python function `read_column(path, column)` that opens a CSV file with a header row, reads the named column with `csv.DictReader`, converts each non-empty cell to `float`, skips empty cells, and raises `KeyError` with a helpful message if the column does not exist.""",
    """Write a Python dataclass `Point` with float fields `x` and `y`, a method `distance_to(other)` returning the Euclidean distance, and an `__add__` that returns a new `Point`. Make it immutable (frozen).""",
    """Implement `levenshtein(a: str, b: str) -> int` in Python, computing the edit distance (insertions, deletions, substitutions) with dynamic programming that keeps only two rows of the table in memory.""",
    """Write a Python function `primes_up_to(n: int) -> list[int]` that returns all primes less than or equal to `n` using the Sieve of Eratosthenes. Return an empty list for `n < 2`.""",
    """Write a Python function `camel_to_snake(name: str) -> str` that converts CamelCase and camelCase identifiers to snake_case, keeping acronyms together: `"HTTPServerError"` becomes `"http_server_error"` and `"parseJSONFile"` becomes `"parse_json_file"`.""",
    """Write a Python function `deep_get(data, path, default=None)` where `path` is a dotted string like `"users.0.address.city"`. Walk through nested dicts and lists (numeric segments index lists) and return `default` if any step is missing instead of raising.""",
    """Write a Python function `count_lines(root, suffix=".py")` that uses `pathlib` to walk a directory tree recursively and returns a dict mapping each matching file's relative path (as a string) to its number of lines. Skip files that cannot be decoded as UTF-8.""",
    """Write a Python function `bar_chart(data: dict[str, int], width: int = 40) -> str` that renders a horizontal ASCII bar chart: one line per key, labels left-aligned to the longest label, bars made of `#` scaled so the largest value uses `width` characters, followed by the value.""",
    """Write a small Python `Stack` class backed by a list with `push`, `pop`, `peek`, `__len__` and `is_empty`. `pop` and `peek` on an empty stack should raise a custom `EmptyStackError` exception that you also define.""",
    """Write an async Python function `fetch_all(urls, fetch, limit=5)` where `fetch` is an async callable taking a URL. Run the fetches concurrently with at most `limit` in flight at once (use `asyncio.Semaphore`) and return the results in the same order as `urls`.""",
    """Write a Python function `find_duplicate_files(paths)` that groups files with identical content. Hash each file with SHA-256, reading it in 64 KiB chunks, and return only the groups that contain more than one path.""",
    """Write a Python function `two_sum(nums, target)` that returns the indices `(i, j)` with `i < j` of two numbers adding up to `target`, in a single pass with a dictionary, or `None` if no such pair exists.""",
    """Write a Python function `transpose(rows, fill=None)` that transposes a ragged list of lists, padding short rows with `fill`. Use `itertools.zip_longest`.""",
    """Write a Python function `format_bytes(n: int) -> str` that renders a byte count in binary units with one decimal place: `1536` becomes `"1.5 KiB"`, `10` becomes `"10 B"`, and values up to TiB are supported. Negative inputs should raise `ValueError`.""",
    """Write a Python function `parse_pairs(text: str) -> dict` that parses strings like `"host=example.org; port=8080; debug"` into `{"host": "example.org", "port": "8080", "debug": True}`. Whitespace around keys and values is ignored, and empty segments are skipped.""",
    """Write a Python function `matmul(a, b)` that multiplies two matrices given as lists of lists without using NumPy. Raise `ValueError` with a clear message if the inner dimensions do not match.""",
    """Write a Python class `TokenBucket(rate, capacity, clock=time.monotonic)` for rate limiting. `allow()` returns `True` and consumes one token if one is available, refilling tokens continuously at `rate` per second up to `capacity`. Accepting `clock` as a parameter makes it testable.""",
    """Write a Python function `topo_sort(graph: dict[str, list[str]]) -> list[str]` that returns a topological ordering of a dependency graph (each key maps to the nodes it points to) using Kahn's algorithm, and raises `ValueError("cycle detected")` if the graph has a cycle.""",
    """Write a Python function `spiral_order(matrix)` that returns the elements of a rectangular matrix in clockwise spiral order starting from the top-left corner. It should work for non-square and empty matrices.""",
    """Write a Python function `dict_diff(old: dict, new: dict)` that compares two flat dictionaries and returns a dict with three keys: `"added"` (keys only in `new`), `"removed"` (keys only in `old`) and `"changed"` (mapping each key to an `(old_value, new_value)` tuple).""",
    """Write a Python function `caesar(text: str, shift: int) -> str` implementing the Caesar cipher. Shift letters within their own case, wrap around the alphabet, leave everything else unchanged, and support negative shifts for decoding.""",
    """Write a Python function `shortest_path(grid, start, goal)` that finds the length of the shortest path in a 2D grid of 0s (open) and 1s (walls), moving up, down, left or right. Use breadth-first search and return `-1` if the goal is unreachable.""",
    """Write a Python function `count_ways(n, steps=(1, 2))` that returns how many distinct ways there are to climb a staircase of `n` steps when each move climbs one of the sizes in `steps`. Memoize it with `functools.lru_cache`.""",
    """Write a Python function `split_sentences(text: str) -> list[str]` that splits a paragraph into sentences on `.`, `!` or `?` followed by whitespace, but does not split after the common abbreviations "Mr.", "Mrs.", "Dr." and "e.g.".""",
    """Define a Python `Enum` called `Color` with members RED, GREEN and BLUE, and write a function `parse_color(name: str) -> Color` that accepts names case-insensitively with surrounding whitespace and raises `ValueError` listing the valid options when the name is unknown.""",
    """Write a small Python command-line script using `argparse` that takes a file path and an optional `-n/--lines` integer (default 10) and prints the first N lines of the file, like `head`. Print a friendly error and exit with status 1 if the file does not exist.""",
    """Write a Python function `weighted_choice(items, weights, rng)` that picks one item with probability proportional to its weight, without using `random.choices`. Build cumulative weights, draw `rng.random() * total` and locate it with `bisect`.""",
    """Write a Python generator `interleave(*iterables)` that yields items round-robin from each iterable, skipping iterables once they are exhausted, until all of them are exhausted. `interleave("abc", "d", "ef")` yields a, d, e, b, f, c.""",
    """Write a Python function `normalize_phone(raw: str) -> str` that accepts US phone numbers in formats such as `"(555) 123-4567"`, `"555.123.4567"` and `"+1 555 123 4567"` and returns them as `"+15551234567"`. Raise `ValueError` if the number does not have 10 digits after removing an optional leading country code 1.""",
    """Write a Python function `pascal_triangle(n: int) -> list[list[int]]` that returns the first `n` rows of Pascal's triangle, building each row from the previous one.""",
    """Write a Python function `invert_dict(d)` that inverts a mapping from keys to values into a mapping from each value to a sorted list of the keys that had it. Values are hashable; keys are sortable.""",
    """Write a Python function `sliding_max(nums, k)` that returns the maximum of every window of size `k` in O(n) time using a monotonic deque of indices.""",
]

# Complete a given snippet.
COMPLETE = [
    """Complete the following Python function so that it returns the median, averaging the two middle values for even-length input:

```python
def median(values):
    \"\"\"Return the median of a non-empty list of numbers.\"\"\"
    s = sorted(values)
    n = len(s)
    # TODO: finish
```""",
    """Fill in the missing methods of this class: `__add__` and `__sub__` (vector arithmetic), `__mul__` (multiplication by a scalar), `__eq__`, and `__abs__` (the Euclidean length).

```python
class Vector2:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __repr__(self):
        return f"Vector2({self.x!r}, {self.y!r})"
```""",
    """Finish this log-line parser. It should return a dict with keys `timestamp` (a `datetime`), `level`, `component` (without the brackets) and `message`, and return `None` for lines that do not match the format.

```python
from datetime import datetime

def parse_log_line(line):
    # Example: '2024-03-01 12:00:03 ERROR [db] connection lost after 3 retries'
    ...
```""",
    """Complete this linked list by implementing `__iter__` (yield the values in order), `__len__`, and `prepend(value)`:

```python
class Node:
    def __init__(self, value, next=None):
        self.value = value
        self.next = next

class LinkedList:
    def __init__(self):
        self.head = None

    def append(self, value):
        node = Node(value)
        if self.head is None:
            self.head = node
            return
        cur = self.head
        while cur.next:
            cur = cur.next
        cur.next = node
```""",
    """Implement the body of `load_config` below. It should read a TOML file with `tomllib`, start from a copy of `DEFAULTS`, override only keys present in the file, and raise `ValueError` if the file contains keys that are not in `DEFAULTS`.

```python
import tomllib

DEFAULTS = {"host": "127.0.0.1", "port": 8000, "debug": False, "workers": 2}

def load_config(path):
    ...
```""",
    """Complete the two functions below: `fibonacci()` should be an infinite generator of Fibonacci numbers starting 0, 1, 1, 2, and `take(n, iterable)` should return the first `n` items as a list.

```python
def fibonacci():
    pass

def take(n, iterable):
    pass

print(take(10, fibonacci()))
```""",
    """Finish this `BankAccount` class. `deposit` must reject non-positive amounts with `ValueError`, `withdraw` must raise `InsufficientFunds` when the balance is too low, and both should append a `(kind, amount)` tuple to `history`.

```python
class InsufficientFunds(Exception):
    pass

class BankAccount:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        ...

    def withdraw(self, amount):
        ...
```""",
    """Complete the `__enter__` and `__exit__` methods so that `with cd("/tmp"):` changes the working directory inside the block and always restores the previous one afterwards:

```python
import os

class cd:
    def __init__(self, path):
        self.path = path
        self._old = None
```""",
    """Complete this recursive function so it returns all permutations of a list, as lists, in lexicographic order of positions (do not use itertools):

```python
def permutations(items):
    if len(items) <= 1:
        return [list(items)]
    result = []
    # your code here
    return result
```""",
    """Complete the JavaScript `debounce` function below so that the returned function delays calling `fn` until `wait` milliseconds have passed since the last call, forwarding the latest arguments and `this`:

```javascript
function debounce(fn, wait) {
  let timer = null;
  return function (...args) {
    // TODO
  };
}
```""",
    """Fill in `word_frequencies` so that it reads the file line by line, lowercases words, strips punctuation with `str.translate`, and returns a `collections.Counter`:

```python
import string
from collections import Counter

def word_frequencies(path):
    table = str.maketrans("", "", string.punctuation)
    counts = Counter()
    ...
```""",
]

# Modify or fix a given snippet.
MODIFY = [
    """This function has a bug: items leak between calls. Explain the cause in one sentence and give the fixed version.

```python
def add_item(item, bucket=[]):
    bucket.append(item)
    return bucket
```""",
    """This binary search sometimes loops forever or misses the last element. Find the bugs and fix them.

```python
def search(arr, target):
    lo, hi = 0, len(arr)
    while lo < hi:
        mid = (lo + hi) // 2
        if arr[mid] == target:
            return mid
        elif arr[mid] < target:
            lo = mid
        else:
            hi = mid - 1
    return -1
```""",
    """Modify `read_numbers` so that it skips blank lines and lines starting with `#`, and, when a line cannot be parsed, raises a `ValueError` that mentions the line number and the offending text.

```python
def read_numbers(path):
    with open(path) as f:
        return [float(line) for line in f]
```""",
    """Add type hints and input validation to this function. It should raise `TypeError` if `prices` is not a list of numbers and `ValueError` if `discount` is not between 0 and 1.

```python
def apply_discount(prices, discount):
    return [round(p * (1 - discount), 2) for p in prices]
```""",
    """Rewrite this function as a generator so that it can process a multi-gigabyte log file without loading it all into memory:

```python
def error_lines(path):
    lines = open(path).readlines()
    result = []
    for line in lines:
        if "ERROR" in line:
            result.append(line.rstrip("\\n"))
    return result
```""",
    """Each callback prints 2 instead of 0, 1 and 2. Explain why and fix the code in two different ways.

```python
callbacks = []
for i in range(3):
    callbacks.append(lambda: print(i))

for cb in callbacks:
    cb()
```""",
    """Make `Version` objects sortable and comparable with `<`, `<=`, `>` and `>=` by adding an `__eq__` and `__lt__` and using `functools.total_ordering`:

```python
class Version:
    def __init__(self, text):
        self.parts = tuple(int(p) for p in text.split("."))

    def __repr__(self):
        return f"Version('{'.'.join(map(str, self.parts))}')"
```""",
    """This function returns `False` for `(0.3, 0.4, 0.5)` even though it is a right triangle. Fix it so it is robust to floating-point error.

```python
def is_right_triangle(a, b, c):
    a, b, c = sorted((a, b, c))
    return a * a + b * b == c * c
```""",
    """Change this function so that it accepts an optional `key` argument that works like the `key` parameter of `sorted()`, and also an optional `reverse` flag.

```python
def top_n(items, n):
    return sorted(items)[:n]
```""",
    """Several threads call `increment()` and the final count is sometimes too low. Fix the race condition using `threading.Lock`.

```python
import threading

counter = 0

def increment(times):
    global counter
    for _ in range(times):
        counter += 1

threads = [threading.Thread(target=increment, args=(100_000,)) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(counter)
```""",
]

# Write unit tests for given code.
TESTS = [
    """Write pytest tests for this function. Cover values below, inside and above the range, the boundaries themselves, and the error case.

```python
def clamp(x, lo, hi):
    if lo > hi:
        raise ValueError("lo must not exceed hi")
    return max(lo, min(x, hi))
```""",
    """Write a `unittest.TestCase` for this function, including mixed case, punctuation, an empty string and a non-palindrome:

```python
import re

def is_palindrome(s):
    cleaned = re.sub(r"[^a-z0-9]", "", s.lower())
    return cleaned == cleaned[::-1]
```""",
    """Write a parametrized pytest test (using `@pytest.mark.parametrize`) for this function:

```python
def fizzbuzz(n):
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)
```""",
    """Write pytest tests for this queue class, including the behaviour when it is empty:

```python
from collections import deque

class Queue:
    def __init__(self):
        self._items = deque()

    def enqueue(self, item):
        self._items.append(item)

    def dequeue(self):
        if not self._items:
            raise IndexError("dequeue from empty queue")
        return self._items.popleft()

    def __len__(self):
        return len(self._items)
```""",
    """Write pytest tests for `parse_version`, covering valid versions and at least three kinds of invalid input (use `pytest.raises`):

```python
def parse_version(text):
    parts = text.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"invalid version: {text!r}")
    return tuple(int(p) for p in parts)
```""",
    """Write tests for this function with pytest. Include division by zero with and without a default, and float results.

```python
def safe_divide(a, b, default=None):
    try:
        return a / b
    except ZeroDivisionError:
        return default
```""",
    """Write pytest tests for this function using the `tmp_path` fixture to create files: an empty file, a file without a trailing newline, and a file with blank lines.

```python
def count_lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)
```""",
    """Write pytest tests for `greeting`. Pass explicit `datetime` objects rather than relying on the real clock, and test each boundary hour.

```python
from datetime import datetime

def greeting(now=None):
    now = now or datetime.now()
    if now.hour < 12:
        return "Good morning"
    if now.hour < 18:
        return "Good afternoon"
    return "Good evening"
```""",
    """Write pytest tests for this retry helper. Use a fake function that fails a set number of times, and check both the success path and the path where it gives up.

```python
def call_with_retries(fn, attempts=3):
    last = None
    for _ in range(attempts):
        try:
            return fn()
        except RuntimeError as exc:
            last = exc
    raise last
```""",
    """Write Jest tests for the following JavaScript function, covering an empty array, negative numbers and non-number elements:

```javascript
function sum(values) {
  if (!Array.isArray(values)) throw new TypeError("expected an array");
  return values.reduce((acc, v) => {
    if (typeof v !== "number") throw new TypeError("non-number element");
    return acc + v;
  }, 0);
}
module.exports = { sum };
```""",
]

# Refactor a given snippet.
REFACTOR = [
    """Refactor this function to use guard clauses (early returns) instead of deep nesting, without changing its behaviour:

```python
def ship_order(order):
    if order is not None:
        if order.paid:
            if order.items:
                if not order.shipped:
                    order.shipped = True
                    return "shipped"
                else:
                    return "already shipped"
            else:
                return "no items"
        else:
            return "unpaid"
    else:
        return "no order"
```""",
    """Refactor this calculator to use a dictionary that maps operator symbols to functions from the `operator` module:

```python
def calc(a, op, b):
    if op == "+":
        return a + b
    elif op == "-":
        return a - b
    elif op == "*":
        return a * b
    elif op == "/":
        return a / b
    elif op == "**":
        return a ** b
    else:
        raise ValueError("unknown operator")
```""",
    """Make this code more idiomatic using comprehensions and the built-ins `any` and `all`:

```python
def check(users):
    active = []
    for u in users:
        if u["active"] == True:
            active.append(u["name"])
    has_admin = False
    for u in users:
        if u["role"] == "admin":
            has_admin = True
    all_verified = True
    for u in users:
        if not u["verified"]:
            all_verified = False
    return active, has_admin, all_verified
```""",
    """Rewrite this class as a `dataclass`, replacing the Java-style getters and setters with plain attributes and a validation step in `__post_init__` (quantity must be non-negative):

```python
class Item:
    def __init__(self, name, price, quantity):
        self._name = name
        self._price = price
        self._quantity = quantity

    def get_name(self):
        return self._name

    def get_price(self):
        return self._price

    def set_price(self, price):
        self._price = price

    def get_quantity(self):
        return self._quantity

    def set_quantity(self, quantity):
        self._quantity = quantity
```""",
    """This module keeps its state in globals. Refactor it into a `Scoreboard` class with the same operations:

```python
scores = {}
history = []

def add_points(player, points):
    scores[player] = scores.get(player, 0) + points
    history.append((player, points))

def leader():
    return max(scores, key=scores.get) if scores else None

def reset():
    scores.clear()
    history.clear()
```""",
    """Refactor this report builder so it uses f-strings and `str.join` instead of repeated string concatenation:

```python
def build_report(rows):
    out = ""
    out = out + "Name | Score\\n"
    out = out + "-----+------\\n"
    for i in range(len(rows)):
        out = out + rows[i][0] + " | " + str(rows[i][1]) + "\\n"
    return out
```""",
    """Refactor this loop to use `zip` and `enumerate` instead of manual indexing:

```python
def report(names, scores):
    i = 0
    while i < len(names):
        print(str(i + 1) + ". " + names[i] + ": " + str(scores[i]))
        i = i + 1
```""",
    """Refactor this function so that the file is always closed (use `with`), and replace the bare `except` with handling of the specific errors that can happen:

```python
import json

def load_settings(path):
    f = open(path)
    try:
        data = json.load(f)
    except:
        data = {}
    f.close()
    return data
```""",
    """Convert this callback-based Node.js code to use `async`/`await` with `fs/promises`, keeping the same behaviour:

```javascript
const fs = require("fs");

function copyUpper(src, dest, cb) {
  fs.readFile(src, "utf8", (err, text) => {
    if (err) return cb(err);
    fs.writeFile(dest, text.toUpperCase(), (err2) => {
      if (err2) return cb(err2);
      cb(null, text.length);
    });
  });
}
```""",
]

# JavaScript / TypeScript.
JS = [
    """Write a JavaScript function `groupBy(array, keyFn)` that returns an object mapping each key produced by `keyFn` to an array of the elements that produced it, preserving their original order.""",
    """Write a JavaScript function `deepEqual(a, b)` that compares two values structurally: primitives with `===` (but treat `NaN` as equal to `NaN`), arrays element by element, and plain objects by their own enumerable keys.""",
    """Write an async JavaScript function `fetchJson(url, timeoutMs = 5000)` that uses `fetch` and an `AbortController` to give up after `timeoutMs`, throws an `Error` including the status code for non-2xx responses, and returns the parsed JSON.""",
    """Write a JavaScript `throttle(fn, interval)` function that calls `fn` at most once per `interval` milliseconds; calls made during the cooldown are ignored.""",
    """Write a TypeScript interface `Task` with `id: number`, `title: string`, `done: boolean` and an optional `due?: Date`, and a function `overdue(tasks: Task[], now: Date): Task[]` that returns unfinished tasks whose due date is before `now`, sorted by due date.""",
    """Write a JavaScript function `titleCase(str)` that capitalises the first letter of every word and lowercases the rest, except for the short words "a", "an", "the", "of", "and" and "in", which stay lowercase unless they are the first word.""",
    """Write a Node.js script that reads a text file given as the first command-line argument and prints the number of lines, words and characters, similar to `wc`. Use `fs.promises` and handle a missing file gracefully.""",
]

# SQL.
SQL = [
    """Given tables `customers(id, name)` and `orders(id, customer_id, amount, created_at)`, write a SQL query that returns the three customers with the highest total order amount in 2023, with their names and totals.""",
    """Table `employees(id, name, salary, manager_id)` stores each employee's manager as another row in the same table. Write a SQL query that lists the employees who earn more than their manager.""",
    """Given `transactions(account_id, tx_date, amount)`, write a PostgreSQL query that returns every transaction together with a running balance per account ordered by date, using a window function.""",
    """Write SQL `CREATE TABLE` statements for a small blog: `posts` (id, title, body, published_at), `tags` (id, unique name) and a `post_tags` join table with a composite primary key and foreign keys that cascade on delete.""",
    """Table `users(id, email, created_at)` contains duplicate e-mail addresses that differ only in case. Write a SQL query that lists each duplicated e-mail (lowercased) and how many rows share it, most frequent first.""",
    """Given `events(user_id, event_type, occurred_at)`, write a PostgreSQL query that computes monthly active users (distinct users with at least one event) for each calendar month of 2024.""",
]

# Shell.
BASH = [
    """Write a bash command or short script that prints the 10 largest files under a given directory (first argument, default `.`), with human-readable sizes, largest first.""",
    """Write a bash script that creates a timestamped `.tar.gz` backup of a directory into `~/backups` and then deletes backups in that folder older than 7 days. Use `set -euo pipefail`.""",
    """Write a bash loop that prints, for every `.csv` file in the current directory, its name and the number of data rows (all lines except the header). File names may contain spaces.""",
    """Write a shell one-liner that reads an nginx access log (`access.log`, client IP in the first field) and prints the five IP addresses with the most requests, together with their counts.""",
    """Write a bash function `retry` that runs a given command up to 5 times, doubling the wait between attempts starting at 1 second, and returns the command's last exit status if all attempts fail. Show an example call.""",
    """Write a bash script that renames every `*.jpeg` file in the current directory to `*.jpg`, handles names with spaces, and refuses to overwrite a file that already exists.""",
]

CATEGORIES = [
    ("py_spec", PY_SPEC),
    ("complete", COMPLETE),
    ("modify", MODIFY),
    ("tests", TESTS),
    ("refactor", REFACTOR),
    ("js", JS),
    ("sql", SQL),
    ("bash", BASH),
]

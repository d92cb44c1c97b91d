"""Hand-written prompts and material for the "explain" task.

Read by build_prompts.py, which adds further explain prompts generated from
the Python standard library's own source and from pydoc_data.topics.
"""

# "Explain the difference between X and Y" style questions.
DIFFERENCES = [
    "Explain the difference between a list and a tuple in Python, and give one situation where each is the better choice.",
    "What is the difference between `is` and `==` in Python? Include an example where they give different results.",
    "Explain the difference between a process and a thread, including how they share memory.",
    "Explain the difference between TCP and UDP, and name one application that typically uses each.",
    "Explain the difference between `git merge` and `git rebase`, and when a team might prefer one over the other.",
    "Explain the difference between a shallow copy and a deep copy in Python, using a nested list as the example.",
    "What is the difference between `__str__` and `__repr__` in Python? Who is each one meant for?",
    "Explain the difference between a stack and a queue, and give a real-world analogy for each.",
    "Explain the difference between an INNER JOIN and a LEFT JOIN in SQL, with a small example of two tables.",
    "Explain the difference between `WHERE` and `HAVING` in SQL.",
    "Explain the difference between `var`, `let` and `const` in JavaScript.",
    "Explain the difference between `==` and `===` in JavaScript, with two surprising examples of `==`.",
    "Explain the difference between concurrency and parallelism in simple terms.",
    "Explain the difference between authentication and authorization.",
    "Explain the difference between HTTP GET and POST requests, including idempotency and caching.",
    "Explain the difference between unit tests and integration tests, and what each is good at catching.",
    "Explain the difference between `return` and `yield` in a Python function.",
    "Explain the difference between an iterable and an iterator in Python.",
    "Explain the difference between `@staticmethod` and `@classmethod` in Python, with an example of when a classmethod is useful.",
    "Explain the difference between the mean and the median, and why the median is often preferred for incomes.",
    "Explain the difference between precision and recall for a classifier, using a spam filter as the example.",
    "Explain the difference between symmetric and asymmetric encryption, and how HTTPS uses both.",
    "Explain the difference between latency and throughput, with an analogy that is not about computers.",
    "Explain the difference between weather and climate to a twelve-year-old.",
    "Explain the difference between a stable and an unstable sorting algorithm, and why stability matters when sorting by several keys.",
    "Explain the difference between simple interest and compound interest, with a numeric example over three years.",
    'Explain the difference between "affect" and "effect", with example sentences for each.',
    "Explain the difference between a virus and a bacterium, and why antibiotics work on only one of them.",
]

# Concept explanations without a comparison.
CONCEPTS = [
    "Explain what a hash table is and why looking up a key is usually fast, for someone who has just learned about arrays.",
    "Explain what happens, step by step, when you type a web address into a browser and press Enter, up to the point the page starts loading.",
    "Explain what the git staging area is and why it exists.",
    "Explain how CPython frees memory: reference counting, and what the cyclic garbage collector is for.",
    "Explain what a race condition is, with a short example involving a shared bank balance.",
    "Explain what a closure is in programming, with a short Python example.",
    "Explain what Big-O notation describes, and why O(n log n) sorting is better than O(n^2) for large inputs.",
    "Explain what an index in a relational database is, and the trade-off it involves for writes.",
    "Explain what a virtual environment in Python is and what problem it solves.",
    "Explain what a regular expression lookahead is, with an example pattern.",
]

# Code snippets (not from the stdlib) to explain.
SNIPPETS = [
    """Explain what this JavaScript code does and what it logs:

```javascript
const orders = [
  { id: 1, status: "paid", total: 30 },
  { id: 2, status: "refunded", total: 12 },
  { id: 3, status: "paid", total: 45 },
];
const revenue = orders
  .filter((o) => o.status === "paid")
  .reduce((sum, o) => sum + o.total, 0);
console.log(revenue);
```""",
    """Explain what this SQL query returns, clause by clause:

```sql
SELECT department, name, salary
FROM (
  SELECT department, name, salary,
         RANK() OVER (PARTITION BY department ORDER BY salary DESC) AS r
  FROM employees
) ranked
WHERE r <= 2
ORDER BY department, salary DESC;
```""",
    """Explain what this shell pipeline does, one stage at a time:

```bash
grep -h "ERROR" logs/*.log | cut -d' ' -f3 | sort | uniq -c | sort -rn | head -5
```""",
    """Explain what this regular expression matches, part by part, and give two strings that match and one that does not:

```python
import re
pattern = re.compile(r"^(?P<user>[\\w.+-]+)@(?P<domain>[\\w-]+(\\.[\\w-]+)+)$")
```""",
    """Explain what this Python code prints and why:

```python
def make_counter():
    count = 0
    def step():
        nonlocal count
        count += 1
        return count
    return step

a = make_counter()
b = make_counter()
print(a(), a(), b(), a())
```""",
    """Explain what this decorator does and what happens when `slow_add(2, 3)` is called twice:

```python
import functools, time

def cached(fn):
    store = {}
    @functools.wraps(fn)
    def wrapper(*args):
        if args not in store:
            store[args] = fn(*args)
        return store[args]
    return wrapper

@cached
def slow_add(a, b):
    time.sleep(1)
    return a + b
```""",
    """Explain what this asyncio program does, and roughly how long it takes to run:

```python
import asyncio

async def worker(name, delay):
    await asyncio.sleep(delay)
    return f"{name} done after {delay}s"

async def main():
    results = await asyncio.gather(worker("a", 2), worker("b", 1), worker("c", 3))
    for r in results:
        print(r)

asyncio.run(main())
```""",
    """Explain what this Dockerfile builds, instruction by instruction, and why the requirements are copied before the rest of the source:

```dockerfile
FROM python:3.11-slim
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
EXPOSE 8000
CMD ["python", "-m", "http.server", "8000"]
```""",
    """Explain what this Makefile rule does and when `make` will rerun it:

```makefile
build/report.pdf: report.md figures/*.png
	mkdir -p build
	pandoc report.md -o $@
```""",
    """Explain what this awk command prints for a CSV file whose third column is a price:

```bash
awk -F, 'NR > 1 { total += $3; n++ } END { if (n) printf "%d rows, average %.2f\\n", n, total / n }' prices.csv
```""",
    """Explain what this Python generator pipeline does and why it uses little memory even for a huge file:

```python
def read_lines(path):
    with open(path) as f:
        for line in f:
            yield line.rstrip("\\n")

def non_empty(lines):
    return (line for line in lines if line.strip())

def lengths(lines):
    return (len(line) for line in lines)

print(max(lengths(non_empty(read_lines("big.txt")))))
```""",
    """Explain what this JavaScript prints and in which order, and why:

```javascript
console.log("start");
setTimeout(() => console.log("timeout"), 0);
Promise.resolve().then(() => console.log("promise"));
console.log("end");
```""",
    """Explain what these git commands do when run in this order:

```bash
git switch -c fix/typo
git add README.md
git commit -m "Fix typo in README"
git switch main
git merge --no-ff fix/typo
git branch -d fix/typo
```""",
    """Explain what this Python class does and how `with` uses it:

```python
class Suppress:
    def __init__(self, *exc_types):
        self.exc_types = exc_types

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return exc_type is not None and issubclass(exc_type, self.exc_types)

with Suppress(KeyError):
    {}["missing"]
print("still running")
```""",
]

# Original paragraphs (written for this project) with a summarising instruction.
PARAGRAPHS = [
    (
        "Summarise the following paragraph in two sentences:",
        """Before automation, lighthouse keepers lived on remote rocks and headlands for weeks at a time, trimming wicks, polishing lenses and winding the clockwork that turned the great lamps. The work was monotonous but unforgiving: a light that went dark for even an hour could send a ship onto the rocks. Keepers kept detailed logbooks of weather, passing vessels and supplies, and many of these logs now serve historians as rare day-by-day records of coastal life. As electric lamps, timers and remote monitoring spread through the twentieth century, the profession slowly disappeared, and the last keepers in many countries left their posts in the 1980s and 1990s.""",
    ),
    (
        "Summarise the following paragraph in one sentence:",
        """Cities are often several degrees warmer than the countryside around them, an effect known as the urban heat island. Dark roofs and asphalt absorb sunlight during the day and release the heat slowly at night, while buildings block the wind that would otherwise carry warm air away. Engines, air conditioners and crowds add waste heat of their own. Because there are fewer trees and less open soil, there is also less evaporation to cool the air. Planners try to reduce the effect with pale roofing materials, street trees, parks and even water features.""",
    ),
    (
        "Summarise the following text as three bullet points:",
        """A sourdough starter is a living culture of wild yeasts and lactic acid bacteria that bakers keep in a jar of flour and water. The yeasts produce carbon dioxide, which makes the dough rise, while the bacteria produce acids that give the bread its tangy flavour and help it keep longer. A starter must be fed regularly with fresh flour and water; if it is neglected, the microbes run out of food and the culture becomes sluggish or smells strongly of acetone. Many bakers keep their starter in the refrigerator between bakes to slow it down, then feed it a few times at room temperature before using it.""",
    ),
    (
        "Summarise this paragraph for a ten-year-old, in no more than three sentences:",
        """Octopuses have around five hundred million neurons, and about two thirds of them are in their arms rather than their central brain. Each arm can taste and touch what it explores and can even keep reacting for a while after being separated from the body. In laboratories, octopuses have learned to unscrew jar lids, recognise individual human keepers, and escape from tanks in ways that surprised their handlers. Because their last common ancestor with humans was a simple worm-like animal, scientists see octopus intelligence as a striking example of a complex mind evolving along a completely separate path.""",
    ),
    (
        "Summarise the key points of this notice in two sentences:",
        """From the first of next month, the Riverside branch library will change its loan rules. Adult members may borrow up to fifteen items at once instead of ten, and the standard loan period for books rises from two weeks to three. Films and video games keep their one-week loan period. Late fees for children's books are being abolished entirely, but members with items more than sixty days overdue will not be able to borrow until those items are returned or paid for. The self-service kiosks will be updated over the coming weekend, so the branch will close two hours early on Saturday.""",
    ),
    (
        "Write a one-sentence summary of this internal memo, then list any action the reader must take:",
        """Following the feedback survey, we are adjusting our hybrid working arrangements. Starting in the new quarter, each team will choose two fixed office days per week instead of the current company-wide Tuesday and Thursday. Team leads should agree their days with their members and enter them in the shared planning calendar by the end of this month so that facilities can plan desk capacity. Meeting rooms will be bookable only on a team's chosen days. Anyone who needs a different arrangement for health or caring reasons should speak to their manager or to the people team, and these requests will be handled confidentially.""",
    ),
    (
        "Summarise the following paragraph in two sentences:",
        """Photosynthesis takes place mainly in the leaves of plants, inside small structures called chloroplasts. Chlorophyll, the green pigment in chloroplasts, captures energy from sunlight. The plant uses that energy to split water molecules drawn up from the roots, releasing oxygen as a by-product. The captured energy is then used to combine carbon dioxide from the air into sugars, which the plant uses for growth or stores as starch. Almost all the oxygen in the atmosphere and most of the energy in food chains can be traced back to this process.""",
    ),
    (
        "Summarise the argument of this paragraph in one sentence, then say whether you find it convincing and why:",
        """When a resource is shared by everyone but owned by no one, each individual has a reason to take a little more than their fair share, because they get the full benefit of the extra while the cost is spread across the whole group. If enough people reason this way, the resource is exhausted, even though everyone would have been better off with restraint. Fisheries, grazing land and clean air are classic examples. The usual remedies are private ownership, government regulation, or community rules that are monitored and enforced by the users themselves, and the last of these has worked better in practice than early theorists expected.""",
    ),
    (
        "Summarise this product recall notice in plain language in two sentences:",
        """BrightHome is voluntarily recalling its model K-200 electric kettle, sold between March and August of this year, because the base connector may overheat when the kettle is used repeatedly without a pause. There have been four reports of scorched countertops and no reports of injuries. Customers should stop using the kettle immediately, unplug the base, and contact BrightHome through the support website for a free replacement base or a full refund. Kettles with a serial number beginning with K2B are not affected by this recall.""",
    ),
    (
        "Summarise the following paragraph in one sentence suitable for a newsletter headline:",
        """After a two-year pilot, the city council has voted to make the protected cycle lanes on Mill Road permanent. Traffic counts show that the number of people cycling on the road has more than doubled since the lanes were installed, while journey times for buses changed by less than a minute. Some shop owners had worried about losing parking spaces, but footfall data from the local business association shows a small increase in visitors. The council will now replace the temporary plastic bollards with raised kerbs and add planting along the route.""",
    ),
    (
        "Summarise this paragraph in two sentences, keeping the most important numbers:",
        """Sleep appears to play an active role in forming long-term memories. In a typical experiment, volunteers learn a list of word pairs in the evening and are tested twelve hours later, either after a night of sleep or after staying awake during the day. Those who slept usually recall around twenty to forty percent more pairs. Recordings of brain activity suggest that during deep sleep the hippocampus replays recent experiences, helping to transfer them to the cortex for longer storage. Disrupting deep sleep with gentle sounds, without fully waking the sleeper, reduces this benefit.""",
    ),
    (
        "Summarise the following paragraph in two sentences:",
        """Coral reefs are built by tiny animals called polyps that live in partnership with algae inside their tissues. The algae provide the coral with most of its food through photosynthesis and give reefs their bright colours. When the water becomes too warm for too long, the partnership breaks down and the coral expels the algae, turning white in a process called bleaching. Bleached coral is not dead, and it can recover if temperatures fall quickly, but repeated or prolonged heatwaves leave corals starving and vulnerable to disease. Several major bleaching events in recent decades have affected large parts of the world's reefs.""",
    ),
    (
        "Explain the main idea of this paragraph in plain language, in three sentences or fewer:",
        """Before movable type, books in Europe were copied by hand, which made them expensive and slow to produce, and errors crept in with every copy. When printing presses using reusable metal letters appeared in the fifteenth century, a single workshop could produce hundreds of identical copies of a text in the time a scribe needed for one. Prices fell, more people learned to read, and scholars in different cities could refer to exactly the same page. Historians still debate how quickly these changes unfolded, but most agree that printing transformed how ideas spread across the continent.""",
    ),
    (
        "Summarise these meeting notes as a short list of decisions and owners:",
        """The team met on Tuesday to review the mobile app release. Priya reported that the crash on older Android devices is fixed in the latest build, and QA has verified it on three test phones. Tom raised the concern that the new onboarding screens have not yet been translated into Spanish and German; the group agreed to ship in English first and add translations in the next minor release, with Tom contacting the translation agency this week. Lena will prepare the store listing and screenshots by Friday. The release date was moved from the 10th to the 14th to allow a final round of testing, and Priya will announce the new date to the support team.""",
    ),
]

CATEGORIES = [
    ("difference", DIFFERENCES),
    ("concept", CONCEPTS),
    ("snippet", SNIPPETS),
]

"""The benchmark's prompt corpus: user requests in seven categories, each split in halves.

A drafter or a controller tuned on one prompt learns that prompt; the speed-ups it shows
there need not survive a new one. So every category holds at least eight prompts, split
alternately into a ``dev`` half (tune and explore on it) and a ``test`` half (report only
from it). Prompts are written in pairs of the same kind, so that both halves cover every
kind (a rename and a bug fix, a wrapped e-mail and a flowing article, …).

Every text here was written for edgespec; ``source`` names the public benchmark whose
*style* a prompt follows, not a text it was taken from. Answers come from the default
target (Qwen2.5-Coder-1.5B-Instruct), greedy, with the model's chat template. Each prompt
stays well under 700 tokens, so a 2-core CPU prefills it in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.errors import EdgespecError

CATEGORIES = (
    "code writing",
    "code editing",
    "summarization",
    "rag",
    "open chat",
    "translation",
    "math reasoning",
)
SPLITS = ("dev", "test", "all")
EDIT_KINDS = ("rename", "signature", "bugfix", "docstring", "typehints", "reformat")


@dataclass(frozen=True)
class CorpusPrompt:
    id: str
    category: str
    split: str  # "dev" or "test"
    text: str  # the user message, sent through the model's chat template
    source: str  # what it is modelled on
    kind: str = ""  # for code editing: one of EDIT_KINDS


def _flow(text: str) -> str:
    """Undo the line wrapping of the source file: single line breaks become spaces, blank
    lines stay. For texts a user would paste as long unwrapped paragraphs."""
    return "\n\n".join(" ".join(part.split("\n")) for part in text.strip().split("\n\n"))


_HUMANEVAL = "written for edgespec, in the style of HumanEval (MIT)"
_MBPP = "written for edgespec, in the style of MBPP (CC BY 4.0)"
_EDIT = "written for edgespec, in the style of CanItEdit / real refactoring requests"
_NEWS = "written for edgespec, in the style of CNN/DailyMail news summarization"
_NOTES = "written for edgespec: work notes, e-mails and minutes like those users paste"
_SQUAD = "written for edgespec, in the style of SQuAD reading comprehension (CC BY-SA 4.0)"
_CHAT = "written for edgespec, in the style of MT-Bench / Alpaca user requests"
_WMT = "written for edgespec, in the style of WMT news translation tasks"
_GSM8K = "written for edgespec, in the style of GSM8K (MIT)"

# -- code writing --------------------------------------------------------------------------

_CODE_WRITING: list[tuple[str, str, str]] = [
    (
        "write-py-runlength-1",
        _HUMANEVAL,
        '''Complete this Python function.

```python
def run_lengths(text: str) -> list[tuple[str, int]]:
    """Split text into runs of the same character and return each run as
    (character, length), in order.

    >>> run_lengths("aaabccdd")
    [('a', 3), ('b', 1), ('c', 2), ('d', 2)]
    >>> run_lengths("")
    []
    """
```''',
    ),
    (
        "write-py-stock-1",
        _MBPP,
        "Write a Python function `best_trade(prices)` that takes a list of daily share prices and "
        "returns the largest profit you could make by buying on one day and selling on a later day, "
        "or 0 if no trade makes money. It should run in linear time. Your code should pass these "
        "tests:\n\nassert best_trade([7, 1, 5, 3, 6, 4]) == 5\nassert best_trade([9, 8, 7]) == 0\n"
        "assert best_trade([]) == 0",
    ),
    (
        "write-py-intervals-2",
        _HUMANEVAL,
        '''Implement the body of this function:

```python
def free_slots(busy: list[tuple[int, int]], day_start: int, day_end: int) -> list[tuple[int, int]]:
    """busy holds meetings as (start, end) minutes since midnight; they may overlap and
    are not sorted. Return the free gaps between day_start and day_end, sorted, leaving out
    gaps of zero length.

    >>> free_slots([(540, 600), (570, 630), (720, 780)], 480, 1020)
    [(480, 540), (630, 720), (780, 1020)]
    """
```''',
    ),
    (
        "write-js-slug-2",
        _MBPP,
        "Write a JavaScript function `slugify(title)` that turns a blog post title into a URL slug: "
        "lower case, accents removed (é becomes e), every run of characters that are not letters or "
        "digits replaced by a single hyphen, and no hyphen at the start or end. Include a few example "
        "calls with the expected output as comments.",
    ),
    (
        "write-py-version-3",
        _HUMANEVAL,
        '''Complete the function below. Do not use any third-party packages.

```python
def compare_versions(a: str, b: str) -> int:
    """Compare two dotted version strings such as "1.10.2" and "1.9".
    Missing parts count as zero, so "2.0" equals "2". Return -1 if a is
    older than b, 1 if it is newer and 0 if they are the same.

    >>> compare_versions("1.10.2", "1.9")
    1
    >>> compare_versions("2.0", "2")
    0
    >>> compare_versions("0.9.9", "1.0")
    -1
    """
```''',
    ),
    (
        "write-py-anagrams-3",
        _MBPP,
        "write a python function that groups words that are anagrams of each other. input is a list "
        "of strings, output is a list of groups (each group a list) in the order the first word of "
        "each group appeared. ignore case. e.g. ['Listen', 'silent', 'cat', 'act', 'dog'] -> "
        "[['Listen', 'silent'], ['cat', 'act'], ['dog']]",
    ),
    (
        "write-go-wordfreq-4",
        _MBPP,
        "Write a Go function `TopWords(text string, n int) []string` that returns the n most frequent "
        "words in text. Words are separated by anything that is not a letter, comparison is case "
        "insensitive, and ties are broken alphabetically. Add a short table-driven test for it.",
    ),
    (
        "write-py-matrix-4",
        _HUMANEVAL,
        '''Write the implementation:

```python
def spiral(matrix: list[list[int]]) -> list[int]:
    """Return the elements of a rectangular matrix in clockwise spiral order,
    starting at the top left corner.

    >>> spiral([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    [1, 2, 3, 6, 9, 8, 7, 4, 5]
    >>> spiral([[1, 2], [3, 4], [5, 6]])
    [1, 2, 4, 6, 5, 3]
    >>> spiral([])
    []
    """
```''',
    ),
]
# -- code editing --------------------------------------------------------------------------

_RENAME_PY = '''class RateLimiter:
    """Allows at most `limit` calls per `window` seconds for each client."""

    def __init__(self, limit, window, clock):
        self.limit = limit
        self.window = window
        self.clock = clock
        self.hits = {}

    def _prune(self, client):
        now = self.clock()
        recent = [t for t in self.hits.get(client, []) if now - t < self.window]
        self.hits[client] = recent
        return recent

    def allow(self, client):
        recent = self._prune(client)
        if len(recent) >= self.limit:
            return False
        recent.append(self.clock())
        return True

    def remaining(self, client):
        recent = self._prune(client)
        return max(0, self.limit - len(recent))

    def retry_after(self, client):
        recent = self._prune(client)
        if len(recent) < self.limit:
            return 0.0
        oldest = min(recent)
        return self.window - (self.clock() - oldest)

    def reset(self, client=None):
        if client is None:
            self.hits.clear()
        else:
            self.hits.pop(client, None)
'''

_RENAME_JS = """function buildInvoice(order, taxRate) {
  const lines = [];
  let subtotal = 0;
  for (const item of order.items) {
    const price = item.unitPrice * item.qty;
    const discount = item.discount ? price * item.discount : 0;
    const amount = price - discount;
    subtotal += amount;
    lines.push({
      sku: item.sku,
      description: item.name,
      qty: item.qty,
      amount: amount.toFixed(2),
    });
  }
  let shipping = 0;
  if (subtotal < 50) {
    shipping = 4.95;
  }
  const tax = (subtotal + shipping) * taxRate;
  const total = subtotal + shipping + tax;
  return {
    customer: order.customer,
    date: new Date().toISOString().slice(0, 10),
    lines,
    subtotal: subtotal.toFixed(2),
    shipping: shipping.toFixed(2),
    tax: tax.toFixed(2),
    total: total.toFixed(2),
  };
}
"""

_SIGNATURE_PY = """import csv


def load_readings(path):
    readings = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            value = float(row["value"])
            if value < 0:
                continue
            readings.append({
                "sensor": row["sensor"],
                "time": row["time"],
                "value": value,
            })
    return readings


def daily_average(path):
    readings = load_readings(path)
    totals = {}
    counts = {}
    for r in readings:
        day = r["time"][:10]
        totals[day] = totals.get(day, 0.0) + r["value"]
        counts[day] = counts.get(day, 0) + 1
    return {day: totals[day] / counts[day] for day in sorted(totals)}
"""

_SIGNATURE_GO = """package store

import (
	"database/sql"
	"fmt"
)

type User struct {
	ID    int64
	Name  string
	Email string
}

func FindUsers(db *sql.DB, nameLike string) ([]User, error) {
	rows, err := db.Query(
		"SELECT id, name, email FROM users WHERE name LIKE ? ORDER BY name",
		"%"+nameLike+"%",
	)
	if err != nil {
		return nil, fmt.Errorf("query users: %w", err)
	}
	defer rows.Close()
	var users []User
	for rows.Next() {
		var u User
		if err := rows.Scan(&u.ID, &u.Name, &u.Email); err != nil {
			return nil, fmt.Errorf("scan user: %w", err)
		}
		users = append(users, u)
	}
	return users, rows.Err()
}
"""

_BUGFIX_PY = '''def paginate(items, page, per_page=10):
    """Return one page of items (pages start at 1) and paging info."""
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    total_pages = len(items) // per_page
    if page < 1 or page > total_pages:
        return {"items": [], "page": page, "total_pages": total_pages}
    start = page * per_page
    end = start + per_page
    return {
        "items": items[start:end],
        "page": page,
        "total_pages": total_pages,
        "has_next": page < total_pages,
        "has_prev": page > 1,
    }
'''

_BUGFIX_JS = """async function fetchAllPages(baseUrl) {
  const results = [];
  let page = 1;
  let done = false;
  while (!done) {
    const res = fetch(`${baseUrl}?page=${page}`);
    if (!res.ok) {
      throw new Error(`request failed with status ${res.status}`);
    }
    const body = await res.json();
    results.concat(body.items);
    done = body.items.length === 0 || page = body.lastPage;
    page++;
  }
  return results;
}
"""

_DOCSTRING_PY = """def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out


def outliers(values, window, threshold):
    averages = moving_average(values, window)
    flagged = []
    for i, avg in enumerate(averages):
        v = values[i + window - 1]
        if abs(v - avg) > threshold:
            flagged.append(i + window - 1)
    return flagged


def clamp(value, low, high):
    if low > high:
        raise ValueError("low must not exceed high")
    return max(low, min(value, high))
"""

_DOCSTRING_JS = """export function parseQuery(query) {
  const params = {};
  const trimmed = query.startsWith("?") ? query.slice(1) : query;
  if (!trimmed) return params;
  for (const pair of trimmed.split("&")) {
    const [rawKey, rawValue = ""] = pair.split("=");
    const key = decodeURIComponent(rawKey);
    const value = decodeURIComponent(rawValue.replace(/[+]/g, " "));
    if (key in params) {
      params[key] = [].concat(params[key], value);
    } else {
      params[key] = value;
    }
  }
  return params;
}

export function buildQuery(params) {
  const parts = [];
  for (const [key, value] of Object.entries(params)) {
    const values = Array.isArray(value) ? value : [value];
    for (const v of values) {
      parts.push(`${encodeURIComponent(key)}=${encodeURIComponent(v)}`);
    }
  }
  return parts.length ? "?" + parts.join("&") : "";
}
"""

_TYPEHINTS_PY = """from dataclasses import dataclass


@dataclass
class Task:
    title: str
    priority: int
    done: bool = False
    tags: list = None


class TaskList:
    def __init__(self):
        self.tasks = []

    def add(self, title, priority=3, tags=None):
        task = Task(title, priority, tags=tags or [])
        self.tasks.append(task)
        return task

    def complete(self, title):
        for task in self.tasks:
            if task.title == title:
                task.done = True
                return True
        return False

    def pending(self, tag=None):
        found = [t for t in self.tasks if not t.done]
        if tag is not None:
            found = [t for t in found if tag in t.tags]
        return sorted(found, key=lambda t: t.priority)

    def counts(self):
        done = sum(1 for t in self.tasks if t.done)
        return {"done": done, "open": len(self.tasks) - done}
"""

_TYPEHINTS_PY_2 = """import json
import os


def load_config(path, defaults=None):
    config = dict(defaults or {})
    if os.path.exists(path):
        with open(path) as fh:
            config.update(json.load(fh))
    return config


def get_setting(config, dotted_key, fallback=None):
    node = config
    for part in dotted_key.split("."):
        if not isinstance(node, dict) or part not in node:
            return fallback
        node = node[part]
    return node


def merge(base, override):
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result


def save_config(path, config, indent=2):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(config, fh, indent=indent, sort_keys=True)
    os.replace(tmp, path)
    return os.path.getsize(path)
"""

_REFORMAT_PY = """def send_report(client, recipients, report, subject='Weekly report', attach_csv=False, dry_run=False):
    body = 'Hello,\\n\\nplease find the ' + report.name + ' report for the week of ' + report.week + ' below.'
    message = {'to': recipients, 'subject': subject + ' - ' + report.name, 'body': body, 'attachments': []}
    if attach_csv:
        message['attachments'].append({'filename': report.name.lower().replace(' ', '_') + '.csv', 'content': report.to_csv()})
    if dry_run:
        print('Would send to ' + ', '.join(recipients) + ': ' + message['subject'])
        return None
    response = client.post('/v1/messages', json=message, timeout=30, headers={'X-Request-Source': 'reports'})
    if response.status_code != 200:
        raise RuntimeError('sending failed: ' + str(response.status_code) + ' ' + response.text)
    return response.json()['id']
"""  # noqa: E501

_REFORMAT_SQL = """select c.id, c.name, count(o.id) as orders, sum(o.total) as revenue, max(o.created_at) as last_order from customers c left join orders o on o.customer_id = c.id and o.status <> 'cancelled' where c.country in ('DE', 'AT', 'CH') and c.created_at >= '2023-01-01' group by c.id, c.name having count(o.id) > 2 order by revenue desc, c.name limit 50;

select p.sku, p.title, sum(i.quantity) as units from order_items i join products p on p.id = i.product_id join orders o on o.id = i.order_id where o.created_at between '2024-01-01' and '2024-03-31' group by p.sku, p.title order by units desc limit 10;
"""  # noqa: E501

_CODE_EDITING: list[tuple[str, str, str, str]] = [
    (
        "edit-rename-py-1",
        "rename",
        _EDIT,
        "In this class, rename the attribute `hits` to `calls_by_client` everywhere it is used, and "
        "rename the method `_prune` to `_recent_calls`. Don't change anything else. Give me the whole "
        "class.\n\n```python\n" + _RENAME_PY + "```",
    ),
    (
        "edit-rename-js-1",
        "rename",
        _EDIT,
        "Please rename `subtotal` to `netAmount` and `lines` to `invoiceLines` throughout this "
        "function (including the returned object's keys). Output the full updated function only.\n\n"
        "```javascript\n" + _RENAME_JS + "```",
    ),
    (
        "edit-signature-py-1",
        "signature",
        _EDIT,
        "Change `load_readings` so that it takes an open file object instead of a path, plus an "
        "optional `min_value=0.0` keyword that replaces the hard-coded `< 0` check. Update "
        "`daily_average` to match: it should still take a path and open the file itself. Return both "
        "functions.\n\n```python\n" + _SIGNATURE_PY + "```",
    ),
    (
        "edit-signature-go-1",
        "signature",
        _EDIT,
        "Change FindUsers to take a context.Context as its first argument and a `limit int` as the "
        "last one, use QueryContext, and add `LIMIT ?` to the query. Keep everything else as it is "
        "and show the complete file.\n\n```go\n" + _SIGNATURE_GO + "```",
    ),
    (
        "edit-bugfix-py-1",
        "bugfix",
        _EDIT,
        "This pagination helper is buggy: the last partial page is never returned and page 1 skips "
        "the first items. Fix it with as few changes as possible and return the corrected "
        "function.\n\n```python\n" + _BUGFIX_PY + "```",
    ),
    (
        "edit-bugfix-js-1",
        "bugfix",
        _EDIT,
        "my function below never returns any results and sometimes crashes. can you find the bugs, "
        "fix them, and give me back the fixed function? keep the structure the same\n\n"
        "```js\n" + _BUGFIX_JS + "```",
    ),
    (
        "edit-docstring-py-1",
        "docstring",
        _EDIT,
        "Add a Google-style docstring to each of these functions (Args, Returns, Raises where it "
        "applies). Do not change the code itself; return the full module.\n\n```python\n"
        + _DOCSTRING_PY
        + "```",
    ),
    (
        "edit-docstring-js-1",
        "docstring",
        _EDIT,
        "Document these two functions with JSDoc comments (@param, @returns, and an @example each). "
        "Leave the code unchanged and reply with the whole file.\n\n```javascript\n" + _DOCSTRING_JS + "```",
    ),
    (
        "edit-typehints-py-1",
        "typehints",
        _EDIT,
        "Add type hints to everything in this module (use built-in generics like list[str] and "
        "`X | None`), and fix the `tags` field so it has a proper default. Return the full code.\n\n"
        "```python\n" + _TYPEHINTS_PY + "```",
    ),
    (
        "edit-typehints-py-2",
        "typehints",
        _EDIT,
        "Please add complete type annotations to these config helpers. Use `Any` from typing where "
        "the value can be anything, and `str | os.PathLike[str]` for paths. No other changes.\n\n"
        "```python\n" + _TYPEHINTS_PY_2 + "```",
    ),
    (
        "edit-reformat-py-1",
        "reformat",
        _EDIT,
        "Reformat this function to follow Black's style: double quotes, lines at most 88 characters "
        "(split the long calls and dicts one argument per line), no other changes to the logic.\n\n"
        "```python\n" + _REFORMAT_PY + "```",
    ),
    (
        "edit-reformat-sql-1",
        "reformat",
        _EDIT,
        "Can you reformat these two queries so they're readable? Upper-case keywords, one clause per "
        "line (SELECT, FROM, JOIN, WHERE, GROUP BY, ...), selected columns one per line, indented "
        "with 4 spaces. Don't change what they do.\n\n```sql\n" + _REFORMAT_SQL + "```",
    ),
]
# -- summarization -------------------------------------------------------------------------

_ARTICLE_BRIDGE = _flow("""
The town council of Meerholt voted on Tuesday evening to close the Old Mill bridge to
motor traffic from the first of March, ending months of argument over the 140-year-old
stone crossing. Engineers who inspected the bridge in the autumn found cracks in two of
its three arches and warned that the daily load of around 6,000 cars and delivery vans
was speeding up the damage.

Under the plan, pedestrians and cyclists will still be able to use the bridge, while
cars will be diverted over the ring road, adding about four minutes to a typical trip
into the centre. Buses on lines 3 and 7 will be rerouted, and the council has promised
to review the timetables after six weeks.

Shop owners on Mill Street were divided. Some fear that losing passing trade will hurt
them; others said a quieter street could bring more people on foot. "We had a petition
with 900 signatures against the closure, but we also know the bridge cannot take it
forever," said Hanna Oostra, who runs a bakery near the river.

The repairs are expected to cost 2.3 million euros, of which the province has agreed to
pay half. Work is due to start in the summer and take at least eighteen months. The
council will decide next year whether cars are allowed back once the work is finished
or whether the bridge stays closed to them for good.
""")

_ARTICLE_SATELLITE = _flow("""
A small weather satellite built by students at a technical university was launched on
Saturday from a spaceport in New Zealand, riding alongside seven commercial payloads.
The shoebox-sized craft, called Nimbus-S, carries a camera and an infrared sensor that
will measure the temperature of cloud tops, data that forecasters use to judge how
strongly a storm is developing.

The project began four years ago as a class assignment and grew to involve more than
sixty students from engineering, physics and computer science. Most of the parts were
bought off the shelf to keep the cost under 180,000 dollars, a fraction of what a
government weather satellite costs. The team wrote its own flight software and tested
the craft in a vacuum chamber borrowed from a nearby research institute.

Ground controllers at the university made contact with the satellite about ninety
minutes after launch, on its first pass over Europe. Its solar panels deployed as
planned, and the batteries are charging. The first images are expected within two
weeks, once the instruments have been switched on one by one and checked.

If it works, the students plan to publish all of their designs so that other
universities can build similar satellites. They also hope to share their temperature
readings with national weather services, which have shown interest in cheap sensors
that could fill gaps between the large satellites.
""")

_EMAIL_MOVE = """Hi all,

Quick update on the office move, since a lot of you have been asking.

The new office at 14 Carver Street will be ready on Monday 12 May. The movers
come on Friday 9 May from 1 pm, so please have your desk packed by noon that
day. Crates will be handed out on Wednesday; label each one with your name and
your new desk number, which you can find on the floor plan in the shared drive.

IT will move monitors, docks and desk phones for you. Please take laptops home
over the weekend and bring them to the new office on Monday. Anything personal
that is fragile (plants, pictures, that one coffee machine) is your own job.

Parking: the new building has 20 spaces for 45 of us, so we are going to use a
booking system. I will send the link next week. There is a bike room in the
basement and the tram stop is a two-minute walk away.

The old office keys have to be returned to me by Friday 16 May. Lost keys cost
us 80 euros each, so please check your drawers.

Thanks for your patience, and let me know if anything is unclear.

Maria
"""

_MINUTES_WRAPPED = """Platform team weekly sync, Thursday
Present: Jonas, Priya, Tomek, Alice (notes), Sven (from 10:20)

1. Incident review. The outage on Monday lasted 47 minutes and was caused by a
   certificate that expired on the internal load balancer. Priya has added an
   alert that fires 21 days before expiry. Tomek will check whether the other
   two load balancers use the same manual renewal process.
2. Kubernetes upgrade. Staging runs 1.29 since last week with no problems. The
   production upgrade is planned for the 28th, in the maintenance window from
   6 to 8 am. Jonas asked for a rollback plan to be written before then; Sven
   agreed to draft it by Tuesday.
3. Cost report. Cloud spend was 12 percent over budget in March, mostly from
   test clusters that were left running over the weekend. Alice suggested an
   automatic shutdown at 8 pm on Fridays for anything tagged as test. Nobody
   objected; Alice will announce it in the engineering channel first.
4. Hiring. Two candidates for the SRE role are in the final round. Interviews
   are on Monday and Wednesday; Priya and Jonas are on both panels.

Next sync: Thursday, same time. Sven will lead it because Alice is on leave.
"""

_RELEASE_WRAPPED = """Tidewater 3.2 release notes

- The editor now autosaves every 30 seconds and when the window loses focus.
  Autosave can be turned off under Settings > Files.
- Search across the whole project is about three times faster on large
  repositories, because the index is now updated in the background.
- Tabs can be pinned. Pinned tabs stay on the left and are not closed by
  "Close all".
- The markdown preview supports tables and task lists.
- Fixed: the cursor jumped to the end of the line after undoing a paste.
- Fixed: the spell checker ignored words with apostrophes.
- Fixed: on Linux, files opened from the terminal were sometimes opened twice.
- Fixed: very long lines in log files no longer freeze the editor; lines over
  10,000 characters are shown folded until you click on them.
- The settings window has a search box, and every setting shows its default
  value next to the current one.
- The minimum supported macOS version is now 12 (Monterey).
- Plugins built for version 2.x must be rebuilt with the new SDK; the old API
  will stop working in version 3.4.
"""

_INCIDENT = _flow("""
Summary of the payment delays on 3 April. Between 09:12 and 11:40 UTC about 4,100 card
payments were accepted by the checkout but not confirmed to customers until up to two
hours later. No payment was lost or charged twice, but around 600 customers contacted
support because their orders showed as pending, and some placed a second order.

The cause was a change to the queue that carries payment confirmations. A new retry
setting, meant to make confirmations more robust, also lowered the number of workers
reading from the queue from twelve to two. Confirmations piled up faster than they were
processed. The change had been tested in staging, where the traffic is too low for the
difference to show.

The on-call engineer noticed the growing queue at 10:05 from a dashboard, not from an
alert, because no alert existed for queue length. The setting was reverted at 11:10 and
the backlog was cleared by 11:40.

Follow-up actions: add an alert when the confirmation queue holds more than 500 messages
for five minutes; run a load test in staging before changing queue settings; send an
apology e-mail to affected customers with instructions for cancelling duplicate orders,
and refund the delivery fee on those orders. Owners and dates are in the tracking
ticket.
""")

_MINUTES_FLOW = _flow("""
Minutes of the Elmwood Road residents' association meeting, 18 March. Twenty-three
households attended, and the chair, Rita Calloway, opened the meeting at 7 pm.

First, the community garden. The council has agreed to lease the empty plot behind the
library to the association for five years at a token rent. Volunteers are needed for
clearing the ground in April; Dev Mehta will keep the sign-up sheet. There was a long
discussion about whether to use raised beds, which cost more but are easier for older
members, and it was agreed to build six raised beds and leave the rest as open ground.

Second, traffic. Several residents complained about cars cutting through the road to
avoid the lights on the high street. The association will ask the council for a speed
survey; if the results support it, it will request speed humps near the school.

Third, the summer party. It will be held on Saturday 21 June in the garden if it is
ready, otherwise in the church hall. The budget is 400 pounds, and anyone who wants to
help should talk to Yusuf.

Finally, the treasurer reported a balance of 1,250 pounds after paying for the insurance.
The meeting closed at 8:35 pm.
""")

_EMAIL_LANDLORD = """Dear Mr Whitfield,

I am writing about the problems in flat 3B, which I have now reported three
times by phone since January.

First, the heating. The radiator in the bedroom has not worked since 14
January. The engineer who came on 2 February said the valve needs replacing
and that he would order the part, but nobody has been back since.

Second, there is damp on the wall behind the wardrobe. It has spread to about
half a metre across and the wardrobe now smells of mould. I have moved my
clothes out, but I am worried about my son, who has asthma.

Third, the front door of the building does not lock properly, so anyone can
walk in. Two parcels have gone missing from the hallway this month.

I have paid my rent on time every month and I would like these repairs to be
done by the end of March. Please let me know in writing when the work will be
scheduled. I am at home on Tuesdays and Thursdays, or a neighbour can let the
workers in.

Yours sincerely,
Clara Jensen
"""

_SUMMARIZATION: list[tuple[str, str, str]] = [
    (
        "sum-news-bridge-1",
        _NEWS,
        "Summarize this news article in 4–5 bullet points.\n\n" + _ARTICLE_BRIDGE,
    ),
    (
        "sum-news-satellite-1",
        _NEWS,
        "Write a one-paragraph summary (3 or 4 sentences) of the following article.\n\n" + _ARTICLE_SATELLITE,
    ),
    (
        "sum-email-move-2",
        _NOTES,
        "Can you summarize this email from our office manager as a short list of what I need to do "
        "and by when? Keep her wording where you can.\n\n" + _EMAIL_MOVE,
    ),
    (
        "sum-minutes-platform-2",
        _NOTES,
        "Summarize these meeting notes: one bullet per agenda item, and then a list of action items "
        "with the owner's name.\n\n" + _MINUTES_WRAPPED,
    ),
    (
        "sum-release-tidewater-3",
        _NOTES,
        "Summarize these release notes in three sections (New, Fixed, Breaking changes), keeping the "
        "original wording of each item.\n\n" + _RELEASE_WRAPPED,
    ),
    (
        "sum-incident-payments-3",
        _NOTES,
        "Give me a short summary of this incident report for a non-technical manager: what happened, "
        "why, and what we are doing about it. A paragraph, no jargon.\n\n" + _INCIDENT,
    ),
    (
        "sum-minutes-residents-4",
        _NOTES,
        "Please summarize the minutes below as bullet points, quoting the decisions exactly as they "
        "were written.\n\n" + _MINUTES_FLOW,
    ),
    (
        "sum-email-landlord-4",
        _NOTES,
        "Summarize this letter in two or three sentences, keeping the key facts and dates.\n\n"
        + _EMAIL_LANDLORD,
    ),
]
# -- rag: questions over a given passage ----------------------------------------------------

_RAG: list[tuple[str, str, str]] = [
    (
        "rag-lighthouse-1",
        _SQUAD,
        "Answer the questions using only the text below.\n\n"
        + _flow("""
The lighthouse on Skarvholm was first lit in 1874, after two cargo ships ran aground on the
reef north of the island in a single winter. It was built of granite quarried on the island
itself and stands 31 metres tall. Its original lamp burned paraffin and could be seen from
about 18 nautical miles away. Three keepers and their families lived on the island until
1961, when the light was electrified; after that a single keeper stayed until the station
was fully automated in 1989. Today the keepers' houses are a small museum, open from June
to August, and a ferry runs from the mainland twice a day in those months. The light still
works and flashes white twice every fifteen seconds.
""")
        + "\n\n1. Why was the lighthouse built?\n2. What was it built from?\n"
        "3. How many keepers lived on the island before 1961?\n4. When was it fully automated?\n"
        "5. How often does the light flash?",
    ),
    (
        "rag-warranty-1",
        _SQUAD,
        _flow("""
Warranty terms. Every Brightwell kettle comes with a two-year warranty from the date of
purchase, extended to three years if the product is registered on our website within 30
days. The warranty covers faults in materials and manufacturing. It does not cover damage
from limescale, from dropping the kettle, or from using it with a voltage other than the
one printed on the base. To make a claim, contact customer service with your receipt and
the serial number, which is on a sticker under the base. We will repair or replace the
kettle at our choice; if the model is no longer made, we will offer one of equal or higher
value. Shipping costs for warranty claims are paid by Brightwell within the EU and the
United Kingdom. Claims from other countries must go through the local retailer.
""")
        + "\n\nBased on the warranty text above:\n- How long is the warranty if I register the kettle "
        "on day 10?\n- My kettle stopped working because of limescale. Is that covered?\n- Where do "
        "I find the serial number?\n- I live in Canada. How do I make a claim?",
    ),
    (
        "rag-axolotl-2",
        _SQUAD,
        "Read this passage and answer the questions below it in full sentences.\n\n"
        + _flow("""
The axolotl is a salamander that lives naturally in only one place: the lake and canal
system of Xochimilco, near Mexico City. Unlike most amphibians, it usually stays in its
larval form for its whole life, keeping its feathery external gills and living entirely in
water. Adults grow to about 23 centimetres. Axolotls can regrow lost limbs, parts of their
spinal cord and even parts of their heart, which has made them an important animal in
medical research. In the wild they are critically endangered: surveys found about 6,000
per square kilometre in 1998 but fewer than 36 in 2014. The main threats are water
pollution, the growth of the city, and fish such as carp and tilapia that were brought
into the lakes and eat young axolotls.
""")
        + "\n\nQuestions:\n1. Where do wild axolotls live?\n2. What is unusual about how they grow "
        "up?\n3. Why are scientists interested in them?\n4. What are the main threats to them?",
    ),
    (
        "rag-library-2",
        _SQUAD,
        _flow("""
Library card rules, Northgate Public Library. Anyone who lives, works or studies in the
county can get a card for free; bring a photo ID and something showing your address. Children
under 14 need a parent to sign the form. With a card you can borrow up to 15 items at once:
books and audiobooks for three weeks, DVDs and board games for one week. Items can be renewed
twice online or at the desk, unless someone else has reserved them. There are no fines for
late books, but if an item is more than six weeks overdue it counts as lost and you will be
charged its replacement cost; the charge is cancelled if you bring it back. Reservations cost
nothing. A lost card can be replaced at the desk for 2 pounds.
""")
        + "\n\nUsing the rules above, answer:\n1. Can my 12-year-old get a card on her own?\n"
        "2. How long can I keep a board game?\n3. What happens if I return a book two months late?",
    ),
    (
        "rag-canal-3",
        _SQUAD,
        "Context:\n"
        + _flow("""
The Brennick Canal was opened in 1796 to carry coal from the Hollin valley mines to the
port at Eastwick, a distance of 42 miles. It needed 58 locks to climb over the ridge between
the two, and a tunnel of just over a mile, dug by hand over six years, through the hill at
Cray. Horses towed the boats along the towpath, while in the tunnel, which had no towpath,
men lay on their backs on the boat's roof and pushed against the ceiling with their legs.
The canal made money for about fifty years, until a railway along the same valley opened in
1849 and took most of its trade. The last commercial boat passed in 1921. Volunteers began
restoring the canal in the 1970s, and 30 miles of it are now open again for pleasure boats.
""")
        + "\n\nQuestions:\n- What was the canal built to carry?\n- How did boats get through the "
        "tunnel?\n- Why did the canal lose its trade?\n- How much of the canal can boats use today?"
        "\n\nAnswer each question briefly, based only on the context.",
    ),
    (
        "rag-sourdough-3",
        _SQUAD,
        _flow("""
A sourdough starter is a mixture of flour and water in which wild yeasts and lactic acid
bacteria live together. The yeasts make carbon dioxide, which makes the bread rise, and the
bacteria make acids that give it its sour taste and help it keep longer. To start one, mix
equal weights of wholemeal flour and water and leave it at room temperature. Every day,
throw away most of it and feed what is left with fresh flour and water. After five to ten
days it should double in size within a few hours of feeding; that is the sign it is ready to
bake with. A starter kept in the fridge only needs feeding once a week. A grey liquid on top
means it is hungry, not that it has gone bad: pour it off and feed it. Pink or orange streaks,
on the other hand, mean it should be thrown away.
""")
        + "\n\nI just read this. Questions: how do I know my starter is ready? what does the "
        "grey liquid mean? what do the bacteria do? and when should I throw it out?",
    ),
    (
        "rag-volcano-4",
        _SQUAD,
        "Answer the questions about the passage. Quote the passage where it helps.\n\n"
        + _flow("""
Mount Karvel, on the island of the same name, is one of the most closely watched volcanoes
in the region. Its last large eruption, in 1952, sent ash eight kilometres into the air and
forced the evacuation of three villages on its eastern side; lava flows destroyed 40 houses
but no one was killed, because the island's observatory had warned of the eruption four days
before. Since then the volcano has had small eruptions every eight to twelve years. The
observatory now uses twelve seismometers, GPS stations that measure how the ground swells as
magma rises, and instruments that measure sulphur dioxide in the air. When two of these
signals rise together, the alert level goes up from green to yellow, and the hiking trails to
the crater are closed.
""")
        + "\n\n1. Why did nobody die in 1952?\n2. How often does the volcano erupt now?\n3. What "
        "does the GPS network measure?\n4. When do the trails close?\n5. How high did the 1952 ash "
        "go?\n6. How many houses were destroyed?",
    ),
    (
        "rag-contract-4",
        _SQUAD,
        _flow("""
Clause 7, Termination. Either party may end this agreement by giving the other written notice
of at least 60 days. The Client may end it with 14 days' notice if the Provider misses two
agreed delivery dates in any period of six months. The Provider may end it at once if an
invoice is more than 45 days overdue after a written reminder. On termination, the Client
pays for all work completed up to the end date, and the Provider hands over all files and
documentation within ten working days. Fees paid in advance for work not yet done are
refunded pro rata. Clauses 9 (Confidentiality) and 11 (Liability) remain in force for three
years after the end of the agreement.
""")
        + "\n\nQuestions about the clause above: (a) We are the Client and the provider missed two "
        "deadlines in four months. How much notice do we need to give? (b) What happens to money we "
        "paid in advance? (c) Which obligations continue after the contract ends, and for how long?",
    ),
]
# -- open chat -----------------------------------------------------------------------------

_OPEN_CHAT: list[tuple[str, str]] = [
    (
        "chat-advice-trip-1",
        "I'm planning a weekend trip to a city I have never visited. What should I think about?",
    ),
    (
        "chat-story-robot-1",
        "Write a short story (about 250 words) about a lighthouse robot that is afraid of the dark. "
        "Give it a gentle ending.",
    ),
    (
        "chat-explain-interest-2",
        "Can you explain compound interest to me like I'm 15? Use an example with real numbers.",
    ),
    (
        "chat-email-decline-2",
        "Help me write a polite email to a recruiter declining a job offer. I liked the team but the "
        "salary was too low and I accepted another offer. Keep the door open for the future.",
    ),
    (
        "chat-advice-sleep-3",
        "I keep waking up at 4 am and can't fall back asleep. Any practical tips? I drink two coffees "
        "a day and usually look at my phone in bed.",
    ),
    (
        "chat-explain-git-3",
        "What's the difference between git merge and git rebase, and when would I use each one? "
        "I'm a junior developer and my team keeps arguing about it.",
    ),
    (
        "chat-poem-autumn-4",
        "Write a poem about the first cold morning of autumn, four stanzas, no rhyming.",
    ),
    (
        "chat-plan-garden-4",
        "I have a small north-facing balcony, about 2 by 3 metres. What could I grow there, and how "
        "should I start? I've never grown anything before.",
    ),
]

# -- translation ---------------------------------------------------------------------------

_TRANSLATION: list[tuple[str, str]] = [
    (
        "translate-en-fr-museum-1",
        "Translate into French:\n\n"
        + _flow("""
The city museum will reopen on 4 June after two years of renovation. Visitors will find a new
glass roof over the central courtyard, a café on the top floor and a room for temporary
exhibitions. The first of these shows photographs of the harbour taken between 1890 and 1930,
many of them never displayed before. Entry will be free for the first weekend, and tickets for
the rest of the summer can be booked online from next Monday.
"""),
    ),
    (
        "translate-de-en-email-1",
        "Please translate this email to English:\n\n"
        "Hallo Herr Brandt,\n\nvielen Dank für Ihr Angebot vom 3. März. Wir haben es im Team "
        "besprochen und würden gerne mit der ersten Phase beginnen, allerdings erst ab Mai, weil "
        "unsere IT-Abteilung im April mit der Umstellung der Server beschäftigt ist. Könnten Sie uns "
        "bis Ende der Woche einen angepassten Zeitplan schicken? Außerdem hätten wir gerne eine "
        "Aufstellung, welche Kosten für die Schulung der Mitarbeiter anfallen.\n\n"
        "Mit freundlichen Grüßen\nSabine Keller",
    ),
    (
        "translate-en-es-recipe-2",
        "Translate this recipe into Spanish, keep the list format:\n\n"
        "Lemon yogurt cake\n- 3 eggs\n- 200 g sugar\n- 250 g plain yogurt\n- 120 ml sunflower oil\n"
        "- zest and juice of one lemon\n- 250 g flour\n- 2 teaspoons baking powder\n\n"
        "Beat the eggs with the sugar until pale. Stir in the yogurt, oil, lemon zest and juice. "
        "Fold in the flour and baking powder. Pour into a greased loaf tin and bake at 180 °C for "
        "45 minutes, until a skewer comes out clean. Let it cool before slicing.",
    ),
    (
        "translate-fr-en-review-2",
        "Translate to English:\n\n"
        + _flow("""
Nous avons passé trois nuits dans cet hôtel au mois d'octobre. La chambre était petite mais
très propre, et la vue sur le port valait vraiment le détour. Le petit-déjeuner était copieux,
avec des produits locaux, même si le café laissait à désirer. Le seul vrai problème, c'est le
bruit : la discothèque d'à côté ferme à trois heures du matin le week-end. Le personnel
était adorable et nous a conseillé d'excellents restaurants. Nous reviendrons, mais en
semaine.
"""),
    ),
    (
        "translate-en-de-notice-3",
        "Translate the following notice into German. It's for the tenants of our building, so use "
        "the formal 'Sie'.\n\n"
        + _flow("""
Dear residents, the water supply to the building will be switched off on Wednesday, 15
November, from 8 am to about 2 pm, while the main pipe in the basement is replaced. Please
fill a few bottles with water beforehand and do not use the washing machine or the
dishwasher that morning. After the work, the water may look brown for a few minutes; let the
tap run until it is clear. We apologise for the inconvenience.
"""),
    ),
    (
        "translate-es-en-news-3",
        "Traduce al inglés, por favor:\n\n"
        + _flow("""
El ayuntamiento ha aprobado un plan para plantar 12.000 árboles en los barrios del sur de la
ciudad durante los próximos cuatro años. Según los técnicos municipales, estas zonas tienen
hasta cinco grados más en verano que el centro, por la falta de sombra y el exceso de
asfalto. Los vecinos podrán proponer calles y plazas a través de una página web, y los
colegios participarán en las plantaciones. El presupuesto total es de 3,4 millones de euros,
financiado en parte con fondos europeos.
"""),
    ),
    (
        "translate-en-es-support-4",
        "Translate into Spanish (Latin American), keep it friendly:\n\n"
        "Hi Carlos, thanks for getting in touch! I'm sorry your order arrived damaged. I've sent a "
        "replacement today by express shipping, so it should reach you by Thursday. You don't need to "
        "send the broken one back; please just recycle it. I've also added a 10% discount code to your "
        "account for your next order. If anything else goes wrong, reply to this message and I'll "
        "sort it out. Have a great week!",
    ),
    (
        "translate-de-en-article-4",
        "Übersetze den folgenden Text ins Englische:\n\n"
        + _flow("""
Immer mehr Menschen in Deutschland fahren mit dem Fahrrad zur Arbeit. Laut einer neuen Umfrage
nutzt inzwischen fast jeder fünfte Berufstätige regelmäßig das Rad, doppelt so viele wie vor
zehn Jahren. Besonders beliebt sind E-Bikes, mit denen auch längere Strecken und Steigungen
kein Problem mehr sind. Viele Städte bauen deshalb neue Radwege, doch Verbände kritisieren,
dass es oft noch an sicheren Abstellplätzen fehlt. Arbeitgeber können helfen, etwa mit
Duschen im Büro oder einem Zuschuss zum Dienstrad.
"""),
    ),
]

# -- math reasoning ------------------------------------------------------------------------

_MATH: list[tuple[str, str]] = [
    (
        "math-bakery-1",
        "A bakery sells muffins for $2.50 each or a box of 6 for $12. Tom needs 20 muffins for a party. "
        "What is the cheapest way to buy them, and how much does he pay? Show your work.",
    ),
    (
        "math-train-1",
        "A train leaves at 9:40 and travels 210 km at an average speed of 84 km/h. It then waits 15 "
        "minutes at a station and travels another 96 km at 72 km/h. At what time does it arrive? "
        "Explain each step.",
    ),
    (
        "math-garden-2",
        "Lena's garden is a rectangle 12 m long and 7 m wide. She wants to put a fence around it, "
        "leaving a 1.5 m gap for a gate. Fencing costs 18 euros per metre. How much will the fence "
        "cost? Show the calculation step by step.",
    ),
    (
        "math-savings-2",
        "Sam saves $35 every week. He already has $120. He wants to buy a bike that costs $540, and "
        "his grandmother promised to give him $50 when he has saved half of the price himself "
        "(counting what he already has). How many weeks until he can buy the bike? Show your "
        "reasoning.",
    ),
    (
        "math-paint-3",
        "One litre of paint covers 9 square metres. A room has four walls, each 4 m wide and 2.5 m "
        "high, with one door of 2 square metres and a window of 1.5 square metres. The walls need two "
        "coats. Paint is sold in 2.5 litre tins. How many tins are needed? Work it out step by step.",
    ),
    (
        "math-class-3",
        "In a class of 32 students, 3/8 walk to school, 25% come by bus, and the rest come by bike or "
        "by car. Twice as many come by bike as by car. How many students come by car? Please show "
        "all steps.",
    ),
    (
        "math-recipe-4",
        "A soup recipe for 4 people uses 600 g of carrots, 2 onions and 1.2 litres of stock. Ana is "
        "cooking for 10 people. Carrots come in 1 kg bags, and stock cubes make 500 ml each. How "
        "many bags of carrots, onions and stock cubes does she need? Show your working.",
    ),
    (
        "math-phone-4",
        "A phone plan costs $15 a month plus $0.10 per minute over 300 minutes. Another plan costs "
        "$25 a month with unlimited minutes. In March, Priya talked for 412 minutes. Which plan "
        "would have been cheaper, and from how many minutes a month is the second plan the better "
        "deal? Explain step by step.",
    ),
]
# -- assembly ------------------------------------------------------------------------------


def _split(index: int) -> str:
    """Alternate within a category, in the order written (pairs of one kind): both halves
    get one of each kind."""
    return "dev" if index % 2 == 0 else "test"


def _build() -> list[CorpusPrompt]:
    out: list[CorpusPrompt] = []

    def add(items: list[tuple], category: str, source: str | None = None) -> None:
        for i, item in enumerate(items):
            if category == "code editing":
                pid, kind, src, text = item
            elif source is not None:
                (pid, text), kind, src = item, "", source
            else:
                (pid, src, text), kind = item, ""
            out.append(CorpusPrompt(pid, category, _split(i), text, src, kind))

    add(_CODE_WRITING, "code writing")
    add(_CODE_EDITING, "code editing")
    add(_SUMMARIZATION, "summarization")
    add(_RAG, "rag")
    add(_OPEN_CHAT, "open chat", _CHAT)
    add(_TRANSLATION, "translation", _WMT)
    add(_MATH, "math reasoning", _GSM8K)
    return out


CORPUS: list[CorpusPrompt] = _build()
BY_ID: dict[str, CorpusPrompt] = {p.id: p for p in CORPUS}


def select(
    split: str = "test", categories: list[str] | None = None, ids: list[str] | None = None
) -> list[CorpusPrompt]:
    """The prompts a benchmark runs: by id (any split) when ids are given, else one split
    of the chosen categories, in corpus order."""
    if split not in SPLITS:
        raise EdgespecError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    for category in categories or []:
        if category not in CATEGORIES:
            raise EdgespecError(f"unknown category {category!r} (known: {', '.join(CATEGORIES)})")
    if ids:
        for pid in ids:
            if pid not in BY_ID:
                raise EdgespecError(f"unknown prompt id {pid!r} (see the ids in edgespec/bench/corpus.py)")
        chosen = [BY_ID[pid] for pid in dict.fromkeys(ids)]
        return [p for p in chosen if not categories or p.category in categories]
    return [
        p
        for p in CORPUS
        if (split == "all" or p.split == split) and (not categories or p.category in categories)
    ]

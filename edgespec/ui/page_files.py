"""What the page adds for files and branches: a "Branch from here" button drawn on every
message (it presses the hidden ``#branch-go`` with the message's index), files dropped on
the message box handed to the file input (``#attach``), and the styles of the chips, the
edit pane and its diff."""

from __future__ import annotations

# Each message row gets one button; a redraw of the chat drops them, so an observer draws
# them again. The index is the row's place among the chat's rows: one row per stored
# message (``views.chat_messages``).
FILES_SCRIPT = """<script>
(() => {
  const setValue = (input, value) => {
    const proto = Object.getPrototypeOf(input);
    Object.getOwnPropertyDescriptor(proto, 'value').set.call(input, value);
    input.dispatchEvent(new Event('input', {bubbles: true}));
    input.dispatchEvent(new Event('change', {bubbles: true}));
  };
  const branch = (index) => {
    const input = document.querySelector('#branch-at input');
    if (!input) return;
    setValue(input, String(index));
    input.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
    setTimeout(() => document.querySelector('#branch-go')?.click(), 150);
  };
  const draw = () => {
    const rows = document.querySelectorAll('#chatbot .message-row');
    rows.forEach((row, index) => {
      if (row.querySelector('.live-slot-answer')) return;
      let button = row.querySelector(':scope .branch-button');
      if (!button) {
        button = document.createElement('button');
        button.className = 'branch-button';
        button.type = 'button';
        button.title = 'Branch from here: a new chat of the messages up to this one';
        button.textContent = 'Branch from here';
        button.addEventListener('click', (event) => {
          event.stopPropagation();
          const all = Array.from(document.querySelectorAll('#chatbot .message-row'));
          branch(all.indexOf(row));
        });
        row.appendChild(button);
      }
    });
  };
  const dropped = (event) => {
    const box = event.target.closest && event.target.closest('#message');
    if (!box || !event.dataTransfer || !event.dataTransfer.files.length) return;
    event.preventDefault();
    const input = document.querySelector('#attach input[type=file]');
    if (!input) return;
    const files = new DataTransfer();
    for (const file of event.dataTransfer.files) files.items.add(file);
    input.files = files.files;
    input.dispatchEvent(new Event('change', {bubbles: true}));
  };
  document.addEventListener('dragover', (event) => {
    if (event.target.closest && event.target.closest('#message')) event.preventDefault();
  });
  document.addEventListener('drop', dropped);
  let pending = false;
  new MutationObserver(() => {
    if (pending) return;
    pending = true;
    setTimeout(() => { pending = false; draw(); }, 250);
  }).observe(document.documentElement, {childList: true, subtree: true});
})();
</script>"""
FILES_STYLE = """<style>
.edgespec-hidden {display: none !important}
.attach-chip {display: inline-block; padding: 2px 8px; margin: 2px 4px 2px 0; border-radius: 12px;
  background: rgba(127, 127, 127, 0.15); font-size: 0.85em}
.branch-button {font-size: 0.75em; opacity: 0.55; margin: 0 8px; background: none; border: none;
  cursor: pointer; align-self: flex-end}
.branch-button:hover {opacity: 1; text-decoration: underline}
#canvas-view pre.canvas-pre {white-space: pre; overflow: auto; max-height: 55vh;
  font-family: ui-monospace, monospace; font-size: 0.82em; line-height: 1.45}
#canvas-diff {font-family: ui-monospace, monospace; font-size: 0.82em}
#canvas-diff .diff-add {background: rgba(46, 160, 67, 0.25)}
#canvas-diff .diff-del {background: rgba(248, 81, 73, 0.25)}
#canvas-changed {font-weight: 600; margin: 4px 0}
</style>"""
FILES_HEAD = FILES_SCRIPT + FILES_STYLE

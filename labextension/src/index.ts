// JupyterLab's MPI panel: every rank of each kernel's world, live while a cell runs. The Jupyter server hands
// the state each kernel writes (mpinb/server/handlers.py); this polls it and draws one section per kernel.

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { URLExt } from '@jupyterlab/coreutils';
import { KernelMessage, ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { heading, KernelState, magic, refusal, rows, SPARK_HEIGHT, SPARK_WIDTH } from './rows';

const EVERY_MS = 300;
const SVG = 'http://www.w3.org/2000/svg';

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

interface RowNodes {
  root: HTMLElement;
  label: HTMLElement;
  where: HTMLElement;
  text: HTMLElement;
  usage: HTMLElement;
  loss: HTMLElement;
  line: SVGPolylineElement;
  holding: HTMLElement;
}

class Section {
  readonly node = element('section', 'mpinb-Panel-kernel');
  private title = element('div', 'mpinb-Panel-title');
  private details = element('div', 'mpinb-Panel-details');
  private list = element('div', 'mpinb-Panel-rows');
  private message = element('pre', 'mpinb-Panel-message');
  private rows = new Map<number, RowNodes>();
  state: KernelState;
  name = '';

  constructor(
    state: KernelState,
    private panel: MPIPanel
  ) {
    this.state = state;
    this.node.dataset.kernel = state.kernel;
    const actions = element('div', 'mpinb-Panel-actions');
    actions.append(
      this.button('Stop', 'stop', undefined, 'Stop the running cell (as the notebook\'s Stop button)'),
      this.button('Restart world', 'restart', undefined, '%mpi restart'),
      this.button('Clear faults', 'clear', undefined, '%mpi inject clear')
    );
    this.message.hidden = true;
    this.message.setAttribute('role', 'status');
    this.node.append(this.title, this.details, actions, this.list, this.message);
  }

  button(label: string, action: string, rank: number | undefined, title: string): HTMLButtonElement {
    const button = element('button', 'jp-Button mpinb-Panel-button', label);
    button.dataset.action = action;
    button.title = title;
    button.onclick = () => void this.panel.act(this, action, rank);
    return button;
  }

  say(text: string, refused = false): void {
    this.message.hidden = false;
    this.message.textContent = text;
    this.message.classList.toggle('mpinb-mod-refused', refused);
  }

  update(state: KernelState): void {
    this.state = state;
    const { title, details } = heading(state);
    this.title.textContent = `${this.name ? this.name + ': ' : ''}${title}`;
    this.details.textContent = details;
    const seen = new Set<number>();
    for (const row of rows(state)) {
      seen.add(row.rank);
      let nodes = this.rows.get(row.rank);
      if (!nodes) {
        nodes = this.makeRow(row.rank);
        this.rows.set(row.rank, nodes);
        this.list.append(nodes.root);
      }
      nodes.root.dataset.state = row.state;
      nodes.root.classList.toggle('mpinb-mod-holding', row.holding !== null);
      nodes.label.textContent = row.label;
      nodes.where.textContent = row.where;
      nodes.text.textContent = row.text;
      nodes.usage.textContent = `CPU ${row.cpu} · ${row.memory}${row.gpu ? ' · ' + row.gpu : ''}`;
      nodes.loss.textContent = row.loss;
      nodes.line.setAttribute('points', row.spark);
      nodes.holding.hidden = row.holding === null;
      nodes.holding.textContent = row.holding ? `⚠ ${row.holding}` : '';
    }
    for (const [rank, nodes] of this.rows) {
      if (!seen.has(rank)) {
        nodes.root.remove();
        this.rows.delete(rank);
      }
    }
  }

  makeRow(rank: number): RowNodes {
    const root = element('div', 'mpinb-Panel-row');
    root.dataset.rank = String(rank);
    const top = element('div', 'mpinb-Panel-rowTop');
    const label = element('span', 'mpinb-Panel-rank');
    const where = element('span', 'mpinb-Panel-where');
    const usage = element('span', 'mpinb-Panel-usage');
    top.append(label, where, usage);
    const text = element('div', 'mpinb-Panel-state');
    const holding = element('div', 'mpinb-Panel-holding');
    const bottom = element('div', 'mpinb-Panel-rowBottom');
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('class', 'mpinb-Panel-spark');
    svg.setAttribute('width', String(SPARK_WIDTH));
    svg.setAttribute('height', String(SPARK_HEIGHT));
    svg.setAttribute('viewBox', `0 0 ${SPARK_WIDTH} ${SPARK_HEIGHT}`);
    svg.setAttribute('aria-hidden', 'true');
    const line = document.createElementNS(SVG, 'polyline');
    svg.append(line);
    const loss = element('span', 'mpinb-Panel-loss');
    const actions = element('span', 'mpinb-Panel-rowActions');
    actions.append(
      this.button('Stacks', 'stacks', rank, `%mpi stacks ${rank}: Python and native`),
      this.button('Straggler', 'inject', rank, `%mpi inject straggler --rank ${rank}`),
      this.button('Debug', 'debug', rank, `%mpi debug --rank ${rank}: the rank JupyterLab's debugger panel shows`)
    );
    bottom.append(svg, loss, actions);
    root.append(top, text, holding, bottom);
    return { root, label, where, text, usage, loss, line, holding };
  }
}

export class MPIPanel extends Widget {
  private sections = new Map<string, Section>();
  private empty = element('p', 'mpinb-Panel-empty', 'No kernel has an MPI world: run a %%mpi cell.');
  private timer: number | undefined;
  private settings = ServerConnection.makeSettings();
  private waiting = new Map<string, Section>(); // request id -> the section that asked
  private busy = false;

  constructor(private app: JupyterFrontEnd) {
    super();
    this.id = 'mpinb-panel';
    this.addClass('mpinb-Panel');
    this.title.caption = 'MPI ranks (mpinb)';
    this.title.label = 'MPI';
    const head = element('h2', 'mpinb-Panel-head', 'MPI ranks');
    this.node.append(head, this.empty);
  }

  start(): void {
    const tick = async () => {
      await this.refresh();
      this.timer = window.setTimeout(tick, EVERY_MS);
    };
    void tick();
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    super.dispose();
  }

  async refresh(): Promise<void> {
    if (this.busy) {
      return;
    }
    this.busy = true;
    try {
      const url = URLExt.join(this.settings.baseUrl, 'mpinb', 'panel');
      const response = await ServerConnection.makeRequest(url, {}, this.settings);
      if (!response.ok) {
        return;
      }
      const data = (await response.json()) as { kernels: KernelState[] };
      this.draw(data.kernels);
    } catch (error) {
      // the server restarting: the next tick asks again
    } finally {
      this.busy = false;
    }
  }

  draw(kernels: KernelState[]): void {
    const names = new Map<string, string>();
    for (const session of this.app.serviceManager.sessions.running()) {
      if (session.kernel) {
        names.set(session.kernel.id, session.path);
      }
    }
    const seen = new Set<string>();
    for (const state of kernels) {
      if (!state.world) {
        continue;
      }
      seen.add(state.kernel);
      let section = this.sections.get(state.kernel);
      if (!section) {
        section = new Section(state, this);
        this.sections.set(state.kernel, section);
        this.node.append(section.node);
      }
      section.name = names.get(state.kernel) ?? '';
      section.update(state);
      for (const [id, answer] of Object.entries(state.answers)) {
        const asking = this.waiting.get(id);
        if (asking) {
          this.waiting.delete(id);
          asking.say(answer.text, !answer.ok);
        }
      }
    }
    for (const [kernel, section] of this.sections) {
      if (!seen.has(kernel)) {
        section.node.remove();
        this.sections.delete(kernel);
      }
    }
    this.empty.hidden = this.sections.size > 0;
  }

  async act(section: Section, action: string, rank?: number): Promise<void> {
    const why = refusal(action, section.state, rank);
    if (why !== null) {
      section.say(`${action === 'inject' ? 'Straggler' : action[0].toUpperCase() + action.slice(1)} refused: ${why}`, true);
      return;
    }
    const kernel = section.state.kernel;
    if (action === 'stop' || action === 'stacks') {
      const url = URLExt.join(this.settings.baseUrl, 'mpinb', 'panel', kernel, action);
      const response = await ServerConnection.makeRequest(
        url,
        { method: 'POST', body: JSON.stringify(rank === undefined ? {} : { rank }) },
        this.settings
      );
      const answer = (await response.json()) as { ok: boolean; text?: string; request?: string };
      if (!answer.ok) {
        section.say(`refused: ${answer.text}`, true);
      } else if (answer.request) {
        this.waiting.set(answer.request, section);
        section.say(`${magic(action, rank)}: reading…`);
      } else {
        section.say(answer.text ?? '');
      }
      return;
    }
    await this.runMagic(section, magic(action, rank));
  }

  /** Run *code* (a %mpi command) in the section's kernel, between cells, and show what it printed. */
  async runMagic(section: Section, code: string): Promise<void> {
    const kernels = this.app.serviceManager.kernels;
    const model = Array.from(kernels.running()).find(k => k.id === section.state.kernel);
    if (!model) {
      section.say(`refused: kernel ${section.state.kernel} is not running`, true);
      return;
    }
    const connection = kernels.connectTo({ model });
    section.say(`${code}: running…`);
    const text: string[] = [];
    try {
      const future = connection.requestExecute({ code, silent: false, store_history: false, allow_stdin: false });
      future.onIOPub = (message: KernelMessage.IIOPubMessage) => {
        if (KernelMessage.isStreamMsg(message)) {
          text.push(message.content.text);
        } else if (KernelMessage.isErrorMsg(message)) {
          text.push(`${message.content.ename}: ${message.content.evalue}`);
        } else if (KernelMessage.isDisplayDataMsg(message) || KernelMessage.isExecuteResultMsg(message)) {
          const plain = message.content.data['text/plain'];
          if (typeof plain === 'string') {
            text.push(plain);
          }
        }
      };
      await future.done;
      section.say(`${code}\n${text.join('').trim() || 'done'}`);
    } catch (error) {
      section.say(`${code}\n${text.join('').trim()}\n${String(error)}`, true);
    } finally {
      connection.dispose();
    }
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'mpinb-panel:plugin',
  description: "A sidebar panel showing every rank of each kernel's MPI world, live while a cell runs",
  autoStart: true,
  // Nothing required but the front end, and the panel goes in through `app.shell.add(..., 'right')`, which
  // JupyterLab's shell and Notebook 7's both have: Notebook 7 lists it under View > Right Sidebar as "Show " and
  // the caption (tests/test_panel_notebook.py). Requiring ILabShell would leave it out of Notebook 7.
  activate: (app: JupyterFrontEnd) => {
    const panel = new MPIPanel(app);
    app.shell.add(panel, 'right', { rank: 900 });
    panel.start();
  }
};

export default plugin;

// What the MPI panel draws of one kernel's world: the server's JSON in, plain rows of text out. No DOM here, so
// node's test runner checks it (test/rows.test.mjs).

export interface RankState {
  rank: number;
  host: string;
  pid: number | null;
  state: string; // idle, running, collective, paused, done, failed, dead
  text: string;
  cpu: number | null;
  rss: number | null;
  gpu_memory?: number | null; // bytes torch holds on the rank's GPU, once it used one
  gpu_use?: number | null; // the device's use in percent
  loss_name: string | null;
  losses: number[];
  holding: string | null;
}

export interface KernelState {
  version: number;
  kernel: string;
  time: number;
  every: number;
  execution_state?: string;
  world: {
    size: number;
    mpi: string;
    launcher: string;
    hosts: { [host: string]: string };
    state: string;
    local: number[];
  } | null;
  cell: { number: number; seconds: number } | null;
  ranks: RankState[];
  answers: { [id: string]: { action: string; rank: number; ok: boolean; text: string } };
}

export interface Row {
  rank: number;
  label: string; // "rank 2"
  where: string; // "host:pid"
  state: string;
  text: string;
  cpu: string;
  memory: string;
  gpu: string; // "GPU 3.0 GiB · 45%", "" for a rank without a GPU
  loss: string; // the last value, with its name
  spark: string; // an SVG polyline's points, "" when fewer than two values
  holding: string | null;
}

export const SPARK_WIDTH = 80;
export const SPARK_HEIGHT = 18;

/** "1.2 GiB", "340 MiB" */
export function bytes(value: number | null): string {
  if (value === null || value === undefined) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 100 || unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
}

/** A short number: 3 significant digits. */
export function short(value: number): string {
  if (value === 0) {
    return '0';
  }
  const magnitude = Math.abs(value);
  if (magnitude >= 1e5 || magnitude < 1e-3) {
    return value.toExponential(2);
  }
  return Number(value.toPrecision(3)).toString();
}

/** The polyline points of a sparkline of *values* in a width x height box, the y axis from their min to max. */
export function sparkline(values: number[], width = SPARK_WIDTH, height = SPARK_HEIGHT): string {
  if (values.length < 2) {
    return '';
  }
  const low = Math.min(...values);
  const high = Math.max(...values);
  const span = high - low || 1;
  const step = width / (values.length - 1);
  return values
    .map((value, i) => {
      const x = i * step;
      const y = height - 1 - ((value - low) / span) * (height - 2);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(' ');
}

/** What a rank's GPU holds and how busy it is: "GPU 3.0 GiB · 45%", "" when the rank has used none. */
export function gpu(rank: RankState): string {
  if (rank.gpu_memory === null || rank.gpu_memory === undefined) {
    return '';
  }
  const use = rank.gpu_use === null || rank.gpu_use === undefined ? '' : ` · ${rank.gpu_use.toFixed(0)}%`;
  return `GPU ${bytes(rank.gpu_memory)}${use}`;
}

export function toRow(rank: RankState): Row {
  const last = rank.losses.length ? rank.losses[rank.losses.length - 1] : null;
  return {
    rank: rank.rank,
    label: `rank ${rank.rank}`,
    where: `${rank.host}:${rank.pid ?? '?'}`,
    state: rank.state,
    text: rank.text,
    cpu: rank.cpu === null || rank.cpu === undefined ? '–' : `${rank.cpu.toFixed(0)}%`,
    memory: bytes(rank.rss),
    gpu: gpu(rank),
    loss: last === null ? '' : `${rank.loss_name ?? 'loss'} ${short(last)}`,
    spark: sparkline(rank.losses),
    holding: rank.holding
  };
}

/** The section's heading lines: what the world is and where it runs. */
export function heading(state: KernelState): { title: string; details: string } {
  const world = state.world;
  if (!world) {
    return { title: 'no MPI world', details: '' };
  }
  const hosts = Object.entries(world.hosts)
    .map(([host, ranks]) => `${host}: ${ranks}`)
    .join('; ');
  const ranks = world.size === 1 ? '1 rank' : `${world.size} ranks`;
  const cell = state.cell ? `, running In[${state.cell.number}] for ${state.cell.seconds.toFixed(0)} s` : '';
  return { title: `${ranks}, ${world.mpi}${cell}`, details: `via ${world.launcher}; ${hosts}` };
}

export function rows(state: KernelState): Row[] {
  return state.ranks.map(toRow);
}

/** Why an action cannot apply now, or null when it can. */
export function refusal(action: string, state: KernelState, rank?: number): string | null {
  // a %%mpi cell running (the kernel's own word), or the kernel busy with another (the server's): the status the
  // server hears on IOPub also reads idle after a message of another channel, so the cell is asked first
  const busy = state.cell !== null || state.execution_state === 'busy';
  const row = rank === undefined ? undefined : state.ranks.find(r => r.rank === rank);
  if (!state.world) {
    return 'no MPI world is running in this kernel';
  }
  switch (action) {
    case 'stop':
      return busy ? null : 'no cell is running: there is nothing to stop';
    case 'stacks':
      if (row && row.state === 'dead') {
        return `rank ${rank} is dead: it has no stacks to read`;
      }
      if (busy && rank !== undefined && !state.world.local.includes(rank)) {
        return `rank ${rank} runs on another host: its stacks are asked of the rank between cells (%mpi stacks ${rank})`;
      }
      return null;
    case 'debug':
      if (row && row.state === 'dead') {
        return `rank ${rank} is dead: the debugger panel cannot show it`;
      }
      return busy ? 'a cell is running: stop it first (the kernel runs one command at a time)' : null;
    case 'restart':
    case 'inject':
    case 'clear':
      return busy ? 'a cell is running: stop it first (the kernel runs one command at a time)' : null;
    default:
      return `unknown action ${action}`;
  }
}

/** The magic each action is the same as. */
export function magic(action: string, rank?: number): string {
  switch (action) {
    case 'stacks':
      return `%mpi stacks ${rank}`;
    case 'debug':
      return `%mpi debug --rank ${rank}`;
    case 'restart':
      return '%mpi restart';
    case 'inject':
      return `%mpi inject straggler --rank ${rank}`;
    case 'clear':
      return '%mpi inject clear';
    default:
      return '';
  }
}

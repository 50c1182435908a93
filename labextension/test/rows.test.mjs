// The panel's pure logic, run by node's test runner against the compiled lib/rows.js (make test builds it).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { bytes, heading, magic, refusal, rows, short, sparkline } from '../lib/rows.js';

const state = {
  version: 1,
  kernel: 'k',
  time: 0,
  every: 0.4,
  execution_state: 'busy',
  world: { size: 2, mpi: 'MPICH 4.3', launcher: 'mpiexec', hosts: { here: '0-1' }, state: 'running', local: [0] },
  cell: { number: 5, seconds: 3.2 },
  ranks: [
    { rank: 0, host: 'here', pid: 10, state: 'collective', text: 'in allreduce #3 on COMM_WORLD since 2.0 s',
      cpu: 99.6, rss: 150 * 1024 * 1024, loss_name: 'loss', losses: [2, 1.5, 1.25], holding: null },
    { rank: 1, host: 'there', pid: 11, state: 'running', text: 'running In[5] at line 7', cpu: null, rss: null,
      loss_name: null, losses: [], holding: 'holding up rank 0: they wait in allreduce #3' }
  ],
  answers: {}
};

test('each rank becomes a row in words', () => {
  const [zero, one] = rows(state);
  assert.equal(zero.label, 'rank 0');
  assert.equal(zero.where, 'here:10');
  assert.equal(zero.cpu, '100%');
  assert.equal(zero.memory, '150 MiB');
  assert.equal(zero.loss, 'loss 1.25');
  assert.equal(one.cpu, '–');
  assert.equal(one.loss, '');
  assert.equal(one.spark, '');
  assert.match(one.holding, /holding up rank 0/);
});

test('the sparkline spans its box, the highest value at the top', () => {
  const points = sparkline([2, 1, 0], 80, 18).split(' ').map(p => p.split(',').map(Number));
  assert.deepEqual(points.map(p => p[0]), [0, 40, 80]);
  assert.equal(points[0][1], 1);
  assert.equal(points[2][1], 17);
  assert.equal(sparkline([1]), '');
  assert.ok(sparkline([1, 1]).length > 0); // a flat line does not divide by zero
});

test('numbers and sizes read short', () => {
  assert.equal(bytes(512), '512 B');
  assert.equal(bytes(3 * 1024 ** 3), '3.0 GiB');
  assert.equal(bytes(null), '–');
  assert.equal(short(0.000123), '1.23e-4');
  assert.equal(short(1.23456), '1.23');
});

test('the heading says size, MPI, the running cell and the hosts', () => {
  const { title, details } = heading(state);
  assert.equal(title, '2 ranks, MPICH 4.3, running In[5] for 3 s');
  assert.equal(details, 'via mpiexec; here: 0-1');
  assert.equal(heading({ ...state, world: null }).title, 'no MPI world');
});

test('actions are refused with the reason when they cannot apply', () => {
  assert.equal(refusal('stop', state), null);
  assert.equal(refusal('stop', { ...state, execution_state: 'idle' }), null); // the cell runs: the kernel says so
  assert.match(refusal('stop', { ...state, execution_state: 'idle', cell: null }), /nothing to stop/);
  assert.equal(refusal('stacks', state, 0), null);
  assert.match(refusal('stacks', state, 1), /another host/);
  assert.match(refusal('restart', state), /stop it first/);
  assert.equal(refusal('restart', { ...state, execution_state: 'idle', cell: null }), null);
  const dead = { ...state, ranks: [{ ...state.ranks[0], state: 'dead' }] };
  assert.match(refusal('stacks', dead, 0), /dead/);
  assert.match(refusal('debug', state, 0), /stop it first/);
  assert.equal(refusal('debug', { ...state, execution_state: 'idle', cell: null }, 0), null);
  assert.match(refusal('debug', { ...dead, execution_state: 'idle', cell: null }, 0), /dead: the debugger panel/);
  assert.match(refusal('stop', { ...state, world: null }), /no MPI world/);
});

test('each action is its magic', () => {
  assert.equal(magic('stacks', 2), '%mpi stacks 2');
  assert.equal(magic('restart'), '%mpi restart');
  assert.equal(magic('inject', 1), '%mpi inject straggler --rank 1');
  assert.equal(magic('clear'), '%mpi inject clear');
  assert.equal(magic('debug', 1), '%mpi debug --rank 1');
});

test('a rank that used its GPU shows what torch holds there and the device use; others show nothing of GPUs', () => {
  const withGpu = { ...state, ranks: [{ ...state.ranks[0], gpu_memory: 3 * 1024 ** 3, gpu_use: 45.2 },
                                      { ...state.ranks[1], gpu_memory: 512 * 1024 ** 2, gpu_use: null }] };
  const [zero, one] = rows(withGpu);
  assert.equal(zero.gpu, 'GPU 3.0 GiB · 45%');
  assert.equal(one.gpu, 'GPU 512 MiB');
  assert.equal(rows(state)[0].gpu, '');
});

// tpu-serve driven by the official OpenAI client library (npm package `openai`) on 127.0.0.1:
// chat and completions, streaming, n, logprobs, unseeded samples that differ, 32 concurrent mixed
// requests equal to each alone, exact usage with a stop string, json_schema output,
// a required tool call (streamed too), a 400 for an unsupported schema keyword, models.retrieve,
// the timing headers (the raw response of `.withResponse()`) and the last streamed chunk's timing.
// Usage: node openai_client.mjs CLIENT_DIR PORT MODEL [DEVICE]. DEVICE: cpu (default) or sim, whose
// responses also carry the simulated chip's timing. Exit 0 when all pass.
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';

const [clientDir, port, model, device = 'cpu'] = process.argv.slice(2);
const onSim = device === 'sim';
const require = createRequire(clientDir + '/package.json');
const mod = require('openai');
const OpenAI = mod.OpenAI ?? mod.default ?? mod;
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 30000 });
const messages = [{ role: 'user', content: 'hi' }];

async function check(name, f) {
  await f();
  console.log(`ok: ${name}`);
}

await check('chat', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, seed: 1 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 6);
});

await check('chat streaming equals non-streaming', async () => {
  const body = { model, messages, max_tokens: 8, temperature: 0, ignore_eos: true };
  const whole = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
});

await check('completions n=3', async () => {
  const r = await client.completions.create({ model, prompt: 'Once', max_tokens: 5, n: 3, seed: 7, temperature: 1, ignore_eos: true });
  assert.equal(r.choices.length, 3);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.usage.completion_tokens, 15);
});

await check('chat logprobs', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 2 });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const t of content) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 2);
  }
});

await check('unseeded samples differ', async () => {
  // Four sampled completions without a seed: each request draws a fresh seed, so (over 8 tokens of a
  // random model's ~100-way distribution) at least two of them differ.
  const rs = await Promise.all([0, 1, 2, 3].map(() =>
    client.completions.create({ model, prompt: 'Once', max_tokens: 8, temperature: 1, ignore_eos: true })));
  assert.ok(new Set(rs.map((r) => r.choices[0].text)).size > 1, 'four unseeded samples were all equal');
});

await check('32 concurrent mixed requests equal each alone', async () => {
  // Greedy and seeded sampled requests of different prompts and lengths, first one at a time, then all
  // 32 at once (the engine batches them): each request's text and token count must not change.
  const prompts = ['Once', 'The cat', 'a b c', 'Hello there', '1 2 3 4', 'x'];
  const req = (i) => ({
    model, prompt: prompts[i % prompts.length], max_tokens: 3 + (i % 5), ignore_eos: true,
    ...(i % 2 ? { temperature: 0.8, top_p: 0.9, seed: 100 + i } : { temperature: 0 }),
  });
  const alone = [];
  for (let i = 0; i < 32; ++i) alone.push(await client.completions.create(req(i)));
  const together = await Promise.all(Array.from({ length: 32 }, (_, i) => client.completions.create(req(i))));
  for (let i = 0; i < 32; ++i) {
    assert.equal(together[i].choices[0].text, alone[i].choices[0].text, `request ${i} differs in a batch`);
    assert.equal(together[i].usage.completion_tokens, alone[i].usage.completion_tokens);
  }
});

await check('stop string usage is exact', async () => {
  // The greedy tokens' texts (one byte each for this byte-level tokenizer's ASCII) from logprobs.
  // A bias towards lowercase letters and a frequency penalty give this random model ASCII text.
  const logit_bias = {};
  for (let c = 97; c <= 122; ++c) logit_bias[String(c)] = 8;
  const base = { model, prompt: 'The stop', max_tokens: 30, temperature: 0, ignore_eos: true, logit_bias, frequency_penalty: 1 };
  const plain = await client.completions.create({ ...base, logprobs: 0 });
  const tokens = plain.choices[0].logprobs.tokens;
  // Only the leading tokens that are one ASCII character each: their text is the server's.
  let text = '';
  for (const t of tokens) {
    if (!/^[\x20-\x7e]$/.test(t)) break;
    text += t;
  }
  let at = -1;
  for (let i = 4; i + 1 < text.length && at < 0; ++i) if (/^[A-Za-z0-9 ]{2}$/.test(text.slice(i, i + 2))) at = i;
  if (at < 0) {
    console.log('note: no ASCII stop string in the greedy text; stop check not run');
    return;
  }
  const stop = text.slice(at, at + 2);
  let k = 0;
  let prefix = '';
  while (!prefix.includes(stop)) prefix += tokens[k++];
  const r = await client.completions.create({ ...base, stop });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.usage.completion_tokens, k);
  assert.equal(r.choices[0].text, text.slice(0, text.indexOf(stop)));
  console.log(`stop ${JSON.stringify(stop)}: ${k} tokens billed`);
});

await check('json_schema output parses and validates', async () => {
  const schema = {
    type: 'object',
    properties: { mood: { enum: ['good', 'bad'] }, ok: { type: 'boolean' }, n: { type: 'null' } },
    required: ['mood', 'ok'],
    additionalProperties: false,
  };
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 400, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } },
  });
  const doc = JSON.parse(r.choices[0].message.content);
  // The schema checked by hand: exactly its keys, the required ones present, each value of its type.
  assert.ok(doc !== null && typeof doc === 'object' && !Array.isArray(doc));
  for (const k of Object.keys(doc)) assert.ok(['mood', 'ok', 'n'].includes(k), k);
  assert.ok(['good', 'bad'].includes(doc.mood));
  assert.equal(typeof doc.ok, 'boolean');
  if ('n' in doc) assert.equal(doc.n, null);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

await check('a required tool call parses', async () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      parameters: { type: 'object', properties: { city: { enum: ['Oslo', 'Lima'] } }, required: ['city'] },
    },
  }];
  const r = await client.chat.completions.create({ model, messages, max_tokens: 400, temperature: 0, tools, tool_choice: 'required' });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.ok(['Oslo', 'Lima'].includes(JSON.parse(call.function.arguments).city));
  // Streamed: the client's chunks carry the same call.
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 400, temperature: 0, tools, tool_choice: 'required', stream: true });
  let args = '';
  let name = '';
  let finish = null;
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      for (const t of ch.delta.tool_calls ?? []) {
        name += t.function?.name ?? '';
        args += t.function?.arguments ?? '';
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(name, 'get_weather');
  assert.deepEqual(JSON.parse(args), JSON.parse(call.function.arguments));
  assert.equal(finish, 'tool_calls');
});

await check('an unsupported schema keyword is a 400 naming it', async () => {
  const schema = { type: 'object', properties: { s: { type: 'string', pattern: '^a' } } };
  await assert.rejects(
    client.chat.completions.create({ model, messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } }),
    (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, 'response_format');
      assert.match(e.message, /pattern/);
      return true;
    },
  );
});

await check('models.retrieve', async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => e.status === 404 && e.code === 'model_not_found');
});
await check('timing headers and the last streamed chunk', async () => {
  const body = { model, prompt: 'Once', max_tokens: 4, temperature: 0, ignore_eos: true };
  const { data, response } = await client.completions.create(body).withResponse();
  assert.equal(data.usage.completion_tokens, 4);
  for (const h of ['x-tpucore-ttft-ms', 'x-tpucore-tpot-ms']) assert.ok(Number(response.headers.get(h)) > 0, h);
  for (const h of ['x-tpucore-sim-ttft-ms', 'x-tpucore-sim-tpot-ms']) {
    assert.equal(response.headers.has(h), onSim, h);
    if (onSim) assert.ok(Number(response.headers.get(h)) > 0, h);
  }
  const stream = await client.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let last = null;
  for await (const chunk of stream) last = chunk;
  assert.equal(last.usage.completion_tokens, 4);
  assert.ok(last.tpucore_timing.ttft_ms > 0 && last.tpucore_timing.tpot_ms > 0);
  assert.equal('sim_tpot_ms' in last.tpucore_timing, onSim);
  if (onSim) assert.ok(last.tpucore_timing.sim_ttft_ms > 0 && last.tpucore_timing.sim_tpot_ms > 0);
});
console.log('all passed');

// Checks deploy/kubernetes/*.yaml with real tools (tests/k8s/package.json):
//
//  1. Every object validates against the Kubernetes OpenAPI schema of its
//     kind (kubernetes-models, generated from the upstream OpenAPI spec).
//  2. The ValidatingAdmissionPolicy evoke-pod-identity is run the way the API
//     server runs it: the binding's namespace selector, then the policy's
//     variables and validations as CEL (@marcbachmann/cel-js) over `object`,
//     `params` (the ConfigMap the binding names) and `namespaceObject`.
//     Shipped pods must be admitted; each forged or privileged pod below must
//     be refused with a message that names its field.
//
// Usage: node tests/k8s/check_manifests.mjs DEPLOY_KUBERNETES_DIR
// Exits 0 when every check holds, 1 otherwise (each failure printed).

import {readFileSync, readdirSync} from 'node:fs';
import {join} from 'node:path';
import {createRequire} from 'node:module';
import {parseAllDocuments} from 'yaml';
import {evaluate} from '@marcbachmann/cel-js';

const require = createRequire(import.meta.url);
const dir = process.argv[2];
if (!dir) {
  console.error('usage: check_manifests.mjs DEPLOY_KUBERNETES_DIR');
  process.exit(2);
}

let failures = 0;
let checks = 0;
function check(ok, what) {
  checks++;
  if (!ok) {
    failures++;
    console.log(`FAIL ${what}`);
  }
}

// ---- 1. Load every manifest and validate it against its schema ------------
const objects = [];
for (const file of readdirSync(dir).filter((f) => f.endsWith('.yaml')).sort()) {
  for (const doc of parseAllDocuments(readFileSync(join(dir, file), 'utf8'))) {
    if (doc.errors.length) {
      check(false, `${file}: YAML: ${doc.errors[0].message}`);
      continue;
    }
    const obj = doc.toJS();
    if (obj) objects.push({file, obj});
  }
}
check(objects.length >= 7, `found ${objects.length} objects in ${dir}, expected at least 7`);

function modelFor(apiVersion, kind) {
  // kubernetes-models/v1/Pod, kubernetes-models/apps/v1/DaemonSet, ...
  return require(`kubernetes-models/${apiVersion}/${kind}`)[kind];
}

for (const {file, obj} of objects) {
  const name = `${file}: ${obj.kind}/${obj.metadata?.name}`;
  let Model;
  try {
    Model = modelFor(obj.apiVersion, obj.kind);
  } catch (e) {
    check(false, `${name}: no schema for ${obj.apiVersion} ${obj.kind}: ${e.message}`);
    continue;
  }
  try {
    new Model(obj).validate();
    check(true, name);
  } catch (e) {
    check(false, `${name}: schema: ${e.message}`);
  }
}

// The checker itself must catch a broken object (else step 1 proves nothing).
{
  const Pod = modelFor('v1', 'Pod');
  let refused = false;
  try {
    new Pod({metadata: {name: 'x'}, spec: {containers: [{name: 'c', image: 'i',
      securityContext: {runAsUser: '20001'}}]}}).validate();
  } catch {
    refused = true;
  }
  check(refused, 'the schema check refuses a pod whose runAsUser is a string');
}

// ---- 2. The admission policy, run as the API server runs it ----------------
const find = (kind, name) => objects.find((o) => o.obj.kind === kind &&
    (name === undefined || o.obj.metadata.name === name))?.obj;
const policy = find('ValidatingAdmissionPolicy', 'evoke-pod-identity');
const binding = find('ValidatingAdmissionPolicyBinding');
check(policy !== undefined, 'ValidatingAdmissionPolicy evoke-pod-identity is shipped');
check(binding !== undefined, 'a ValidatingAdmissionPolicyBinding is shipped');
if (!policy || !binding) {
  console.log(`${failures} of ${checks} checks failed`);
  process.exit(1);
}
check(binding.spec.policyName === policy.metadata.name, 'the binding names the policy');
check((binding.spec.validationActions || []).includes('Deny'), 'the binding denies');
check(policy.spec.failurePolicy === 'Fail', 'the policy fails closed');
check(policy.spec.validations?.length >= 5, 'the policy has its validations');
const rules = policy.spec.matchConstraints.resourceRules;
check(rules.some((r) => r.resources.includes('pods') && r.operations.includes('CREATE') &&
    r.operations.includes('UPDATE')), 'the policy matches pod CREATE and UPDATE');
check(rules.some((r) => r.resources.includes('pods/ephemeralcontainers')),
    'the policy matches pods/ephemeralcontainers');
const paramRef = binding.spec.paramRef;
const params = find('ConfigMap', paramRef.name);
check(params !== undefined && params.metadata.namespace === paramRef.namespace,
    `the binding's params ConfigMap ${paramRef.namespace}/${paramRef.name} is shipped`);
check(paramRef.parameterNotFoundAction === 'Deny', 'a missing params ConfigMap denies');

// Every uid the tenants ConfigMap pins is a principal of evoked's policy.
const accessPolicy = find('ConfigMap', 'evoked-policy').data['policy.txtpb'];
for (const [key, value] of Object.entries(params.data)) {
  if (key.endsWith('.uid')) {
    check(new RegExp(`uids:\\s*${value}\\b`).test(accessPolicy),
        `evoke-tenants ${key}=${value} is a uid of evoked-policy.yaml`);
  }
}

// CEL sees integers as int (BigInt here), as the API server's typed CEL does.
function toCel(v) {
  if (typeof v === 'number' && Number.isInteger(v)) return BigInt(v);
  if (Array.isArray(v)) return v.map(toCel);
  if (v && typeof v === 'object') {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, toCel(x)]));
  }
  return v;
}

function selectorMatches(selector, labels) {
  if (!selector) return true;
  for (const [k, v] of Object.entries(selector.matchLabels || {})) {
    if (labels[k] !== v) return false;
  }
  for (const e of selector.matchExpressions || []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    if (e.operator === 'In' && !(has && e.values.includes(labels[e.key]))) return false;
    if (e.operator === 'NotIn' && has && e.values.includes(labels[e.key])) return false;
    if (e.operator === 'Exists' && !has) return false;
    if (e.operator === 'DoesNotExist' && has) return false;
  }
  return true;
}

// Returns the messages of the validations that refuse `pod` in namespace
// `ns` (empty: admitted). Throws if an expression does not evaluate, as the
// API server would then refuse the request (failurePolicy: Fail).
function admit(ns, pod) {
  const namespaceObject = {metadata: {name: ns, labels: {'kubernetes.io/metadata.name': ns}}};
  if (!selectorMatches(binding.spec.matchResources?.namespaceSelector,
      namespaceObject.metadata.labels)) {
    return [];
  }
  const ctx = {object: toCel(pod), params: toCel(params), namespaceObject, variables: {}};
  for (const v of policy.spec.variables || []) {
    ctx.variables[v.name] = evaluate(v.expression, ctx);
  }
  const refusals = [];
  for (const val of policy.spec.validations) {
    if (evaluate(val.expression, ctx) !== true) {
      refusals.push(val.messageExpression ? evaluate(val.messageExpression, ctx) : val.message);
    }
  }
  return refusals;
}

// The refusals of `pod` in `ns`, or null (a failed check) when a CEL
// expression does not evaluate.
function tryAdmit(ns, pod, what) {
  try {
    return admit(ns, pod);
  } catch (e) {
    check(false, `${what}: CEL error: ${e.message}`);
    return null;
  }
}

function expectAdmitted(ns, pod, what) {
  const refusals = tryAdmit(ns, pod, what);
  if (refusals === null) return;
  check(refusals.length === 0, `${what}: admitted in ${ns} (refused: ${refusals.join(' | ')})`);
}

function expectRefused(ns, pod, field, what) {
  const refusals = tryAdmit(ns, pod, what);
  if (refusals === null) return;
  const named = refusals.some((m) => m.includes(field));
  check(refusals.length > 0 && named,
      `${what}: refused in ${ns} naming ${field} (got: ${refusals.join(' | ') || 'admitted'})`);
  if (process.env.VERBOSE && refusals.length) console.log(`  ${what}: ${refusals[0]}`);
}

const podOf = (workload) => ({apiVersion: 'v1', kind: 'Pod',
  metadata: {name: 'p', namespace: workload.metadata.namespace},
  spec: workload.spec.template.spec});
const clone = (x) => JSON.parse(JSON.stringify(x));

// The shipped pods.
const engine = find('Deployment', 'engine-a');
const daemon = find('DaemonSet', 'evoked');
check(engine !== undefined && daemon !== undefined, 'engine-example and the DaemonSet are shipped');
const enginePod = podOf(engine);
expectAdmitted(engine.metadata.namespace, enginePod, 'the shipped engine pod');
expectAdmitted('evoke', podOf(daemon), 'the shipped evoked pod');
check(!JSON.stringify(enginePod).includes('"privileged"'),
    'the engine pod needs no privileged mode');

// Forged identities and host access, in a tenant namespace (inference: 20001).
const T = 'inference';
const withPod = (f) => { const p = clone(enginePod); f(p.spec); return p; };
expectRefused(T, withPod((s) => { s.securityContext.runAsUser = 10001; }),
    'runAsUser', 'a tenant pod claiming the operator uid');
expectRefused(T, withPod((s) => { s.securityContext.runAsUser = 20002; }),
    'runAsUser', 'a tenant pod claiming another tenant\'s uid');
expectRefused(T, withPod((s) => { delete s.securityContext.runAsUser; }),
    'runAsUser', 'a tenant pod that leaves runAsUser to its image');
expectRefused(T, withPod((s) => { s.containers[0].securityContext.runAsUser = 0; }),
    'runAsUser', 'one container overriding runAsUser to root');
expectRefused(T, withPod((s) => {
  s.initContainers = [{name: 'init', image: 'x', securityContext: {runAsUser: 10001}}];
}), 'runAsUser', 'an init container as the operator');
expectRefused(T, withPod((s) => {
  s.ephemeralContainers = [{name: 'dbg', image: 'x', securityContext: {runAsUser: 20002}}];
}), 'runAsUser', 'an ephemeral container as another tenant');
expectRefused(T, withPod((s) => { s.securityContext.runAsGroup = 10001; }),
    'runAsGroup', 'a tenant pod claiming the operator gid');
expectRefused(T, withPod((s) => { s.containers[0].volumeMounts[0].readOnly = false; }),
    'readOnly', 'a writable socket mount');
expectRefused(T, withPod((s) => {
  s.volumes.push({name: 'data', hostPath: {path: '/var/lib/evoke'}});
}), 'hostPath', 'a tenant pod mounting evoked\'s data dir');
expectRefused(T, withPod((s) => { s.volumes.push({name: 't', hostPath: {path: '/tmp'}}); }),
    'hostPath', 'a tenant pod mounting another host dir');
expectRefused(T, withPod((s) => { s.hostUsers = false; }), 'hostUsers',
    'a tenant pod in its own user namespace');
expectRefused(T, withPod((s) => { s.hostPID = true; }), 'hostPID', 'a tenant pod with hostPID');
expectRefused(T, withPod((s) => { s.containers[0].securityContext.privileged = true; }),
    'privileged', 'a privileged tenant pod');
expectRefused(T, withPod((s) => {
  s.containers[0].securityContext.capabilities = {add: ['SYS_PTRACE']};
}), 'capabilities', 'a tenant pod adding SYS_PTRACE');
expectAdmitted(T, withPod((s) => {
  delete s.securityContext.runAsUser;
  s.containers[0].securityContext.runAsUser = 20001;
}), 'runAsUser set on the container instead of the pod');
expectAdmitted('inference-b', withPod((s) => {
  s.securityContext.runAsUser = 20002;
  s.securityContext.runAsGroup = 20002;
}), 'engine-b\'s pod in its own namespace');

// Any other namespace: no way to evoke's directories, no privileged pods.
const O = 'dev';
const plain = {apiVersion: 'v1', kind: 'Pod', metadata: {name: 'p', namespace: O},
  spec: {containers: [{name: 'c', image: 'x'}]}};
const other = (f) => { const p = clone(plain); f(p.spec); return p; };
expectAdmitted(O, plain, 'a plain pod elsewhere');
expectAdmitted(O, other((s) => { s.securityContext = {runAsUser: 20001}; }),
    'uid 20001 elsewhere, without the socket (it cannot reach evoked)');
for (const path of ['/run/evoke', '/var/lib/evoke', '/var/lib/evoke/db', '/var/run/evoke',
  '/run', '/var/run', '/var/lib', '/var', '/', '/proc', '/proc/1/root']) {
  expectRefused(O, other((s) => {
    s.securityContext = {runAsUser: 20001, runAsGroup: 20001, supplementalGroups: [10001]};
    s.volumes = [{name: 'h', hostPath: {path}}];
    s.containers[0].volumeMounts = [{name: 'h', mountPath: '/h', readOnly: true}];
  }), 'hostPath', `hostPath ${path} outside a tenant namespace`);
}
for (const path of ['/run/evoke/', '/run//evoke', '/run/./evoke', '/tmp/../run/evoke',
  'run/evoke', '/run/evoke/.']) {
  expectRefused(O, other((s) => { s.volumes = [{name: 'h', hostPath: {path}}]; }),
      'hostPath', `the unnormalized hostPath ${JSON.stringify(path)}`);
}
expectAdmitted(O, other((s) => { s.volumes = [{name: 'h', hostPath: {path: '/srv/data'}}]; }),
    'a hostPath away from evoke\'s directories (Pod Security decides on it)');
expectRefused(O, other((s) => { s.containers[0].securityContext = {privileged: true}; }),
    'privileged', 'a privileged pod elsewhere');
expectRefused(O, other((s) => {
  s.initContainers = [{name: 'i', image: 'x', securityContext: {privileged: true}}];
}), 'privileged', 'a privileged init container elsewhere');
expectRefused(O, podOf(daemon), 'hostPath', 'the evoked pod outside namespace evoke');

console.log(`${checks - failures} of ${checks} checks passed`);
process.exit(failures ? 1 : 0);

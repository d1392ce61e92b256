// Package corpus makes training text: a procedural grammar of short
// children's stories (characters, names, places, objects, feelings,
// events, dialogue; a beginning, a middle and an end), deterministic from
// a seed, and the reading of any plain-text corpus a user brings.
package corpus

import (
	"math/rand/v2"
	"strings"
)

// Story returns story number i of the corpus with the given seed. Each
// story draws from its own random stream (seed, i), so any story can be
// made alone, in any order, on any number of goroutines.
func Story(seed uint64, i int) string {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	v := cast(rng)
	plot := pick(rng, plots)
	var parts []string
	parts = append(parts, expand(rng, pick(rng, intros), v))
	parts = append(parts, expand(rng, pick(rng, likes), v))
	for _, step := range plot {
		parts = append(parts, expand(rng, step, v))
	}
	parts = append(parts, expand(rng, pick(rng, endings), v))
	var sb strings.Builder
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if sb.Len() > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(capitalize(p))
	}
	return sb.String()
}

// cast picks the story's characters, place, object and food, and fills
// the template variables that name them.
func cast(rng *rand.Rand) map[string]string {
	v := map[string]string{}
	hero := character(rng, "")
	friend := character(rng, hero["name"])
	for k, x := range hero {
		v[k] = x
	}
	for k, x := range friend {
		v["f"+k] = x
	}
	pl := pick(rng, places)
	v["place"] = pl.name
	spots := rng.Perm(len(pl.spots))
	v["spot1"], v["spot2"], v["spot3"] = pl.spots[spots[0]], pl.spots[spots[1]], pl.spots[spots[2]]
	v["toy"] = pick(rng, toys)
	v["color"] = pick(rng, colors)
	v["obj"] = v["color"] + " " + v["toy"]
	v["aobj"] = article(v["color"]) + " " + v["obj"]
	v["food"] = pick(rng, foods)
	v["afood"] = article(v["food"]) + " " + v["food"]
	v["time"] = pick(rng, times)
	v["when"] = pick(rng, whens)
	fear := pick(rng, fears)
	v["afear"], v["fearn"] = article(fear[0])+" "+fear[0], fear[1]
	build := pick(rng, builds)
	v["abuild"], v["buildn"] = article(build[0])+" "+build[0], build[1]

	v["good"] = pick(rng, goodFeelings)
	v["bad"] = pick(rng, badFeelings)
	// Activities mention {his} and {toy}: expand them now with the hero's words.
	v["activity"] = expand(rng, pick(rng, activities), v)
	return v
}

// character picks a child or an animal, with a name other than avoid.
func character(rng *rand.Rand, avoid string) map[string]string {
	c := map[string]string{}
	girl := rng.IntN(2) == 0
	c["adj"] = pick(rng, personAdjs)
	if rng.IntN(3) > 0 { // two thirds children, one third animals
		names := boyNames
		c["kind"], c["parent"], c["sound"], c["move"] = "boy", pick(rng, []string{"mom", "dad"}), "laughed", "ran"
		if girl {
			names = girlNames
			c["kind"] = "girl"
		}
		c["name"] = pickOther(rng, names, avoid)
		c["who"] = c["name"]
	} else {
		a := pick(rng, animals)
		c["kind"], c["parent"], c["sound"], c["move"] = a.kind, pick(rng, []string{"mama", "papa"}), a.sound, a.move
		c["name"] = pickOther(rng, petNames, avoid)
		c["who"] = c["name"] + " the " + a.kind
	}
	c["he"], c["him"], c["his"] = "he", "him", "his"
	if girl {
		c["he"], c["him"], c["his"] = "she", "her", "her"
	}
	c["a"] = article(c["adj"])
	return c
}

func pickOther(rng *rand.Rand, xs []string, avoid string) string {
	for {
		if x := pick(rng, xs); x != avoid {
			return x
		}
	}
}

func article(word string) string {
	if word != "" && strings.ContainsRune("aeiou", rune(word[0])) {
		return "an"
	}
	return "a"
}

var intros = []string{
	"{time}, there was {a} {adj} {kind} named {name}.",
	"{time}, {a} {adj} {kind} called {name} lived near {place}.",
	"{name} was {a} {adj} {kind} who lived in a [small|little|cozy|big] [house|home] near {place}.",
	"{time}, in a [small|quiet|pretty|sleepy] town, there lived {a} {adj} {kind}. {His} name was {name}.",
	"There once was {a} {adj} {kind} named {name}.",
}

var likes = []string{
	"{He} loved to {activity}.",
	"{His} favorite thing in the world was {his} {obj}.",
	"Every day, {name} liked to {activity} with {his} friend {fname}, {fa} {fadj} {fkind}.",
	"{He} [liked|loved] to go to {place} and {activity}.",
	"{Name} had {aobj} that {he} [took|carried] everywhere.",
}

// plots are the middles of stories, one template per sentence group.
var plots = [][]string{
	{ // a lost object found with a friend's help
		"{when}, {name} went to {place} with {his} {obj}.",
		"{He} [played|played and played] until the sun [was low|began to set|went down].",
		"When it was time to go home, {name} could not find {his} {toy}. {He} felt very {bad}.",
		"[Just then|Soon|After a while], {fwho} came by. \"Why are you {bad}, {name}?\" {fname} asked.",
		"\"I lost my {obj},\" {name} [said|cried|replied]. \"Can you help me find it?\"",
		"\"Yes, I will help you,\" {fname} said. They looked {spot1}, but the {toy} was not there.",
		"They looked {spot2}, but it was not there either.",
		"Then {fname} looked {spot3} and saw something {color}. \"I found it!\" {fhe} [shouted|cried|said].",
		"{Name} hugged {fname} and said, \"Thank you! You are a good friend.\"",
	},
	{ // sharing food
		"{when}, {name} took {afood} to {place}.",
		"{He} sat {spot1} and was about to eat it when {he} saw {fwho}.",
		"{Fname} looked {bad}. \"I am so hungry,\" {fhe} said. \"I have no food today.\"",
		"{Name} looked at {his} {food}. {He} wanted to eat it all, but {he} thought about {fname}.",
		"\"Here, we can share my {food},\" {name} said, and {he} gave half of it to {fname}.",
		"{Fname} smiled. \"Thank you, {name}! That is very kind of you.\"",
		"They ate the {food} together {spot2} and laughed. It tasted even better when they shared it.",
	},
	{ // a fear faced with a parent's help
		"{when}, {name} and {his} {parent} went to {place}.",
		"Suddenly there was {afear} and {name} felt very scared.",
		"\"I want to go home,\" {name} said. {He} hid {spot1}.",
		"{His} {parent} sat down next to {him}. \"It is okay to be scared,\" {his} {parent} said. \"But I am here with you.\"",
		"{Name} held {his} {parent}'s hand and took a deep breath. {He} was not so scared anymore.",
		"Soon the {fearn} was gone and the sun came out. {Name} [ran|danced|played] {spot2} and felt brave and {good}.",
	},
	{ // building something, failing, trying again
		"{when}, {name} wanted to build {abuild} at {place}.",
		"{He} worked very hard, but the {buildn} fell down. {Name} felt {bad} and [wanted to cry|sat down].",
		"{Fwho} saw {him} and came over. \"Do not give up,\" {fhe} said. \"Let us try again together.\"",
		"This time {name} and {fname} worked together. {Fname} [held the pieces|found more sticks|brought more sand|helped at the bottom].",
		"At last the {buildn} stood up tall and strong. \"We did it!\" they [shouted|cheered|said].",
		"{Name} was so {good}. {He} learned that hard things are easier with a friend.",
	},
	{ // helping a hurt animal
		"{when}, {name} was walking near {place} when {he} heard a small sound {spot1}.",
		"It was a little bird with a hurt wing. The bird could not fly and it looked {bad}.",
		"\"Poor little bird,\" {name} said. \"I will take care of you.\"",
		"{Name} carried the bird home very gently. {His} {parent} helped {him} make a soft bed in a box.",
		"Every day, {name} gave the bird water and seeds. {He} sang songs to it so it would not be lonely.",
		"After many days, the bird's wing was better. It flapped its wings and flew up into the sky.",
		"{Name} waved goodbye. {He} was {good} that {he} had helped the little bird.",
	},
	{ // a race with a friend
		"{when}, {name} and {fname} had a race to {place}.",
		"\"I will win!\" {name} said, and {he} {move} as fast as {he} could.",
		"But on the way, {fname} fell down {spot1} and hurt {fhis} knee. {Fhe} started to cry.",
		"{Name} stopped running. {He} went back to help {fname} get up.",
		"\"Are you okay?\" {name} asked. \"We can walk the rest of the way together.\"",
		"So they walked together to {place}. Nobody won the race, but they were both {good}.",
		"{Name} knew that being a good friend was more important than winning.",
	},
	{ // a curious discovery
		"{when}, {name} found a [tiny door|shiny key|old map|little box] {spot1} at {place}.",
		"{He} was very curious. \"What could it be?\" {he} [wondered|asked {fname}].",
		"{Name} and {fname} followed the [path|map|trail|sound] past {spot2}.",
		"At the end they found a [secret garden full of flowers|box of shiny stones|family of baby ducks|little house made of wood].",
		"\"Wow!\" said {fname}. \"This is the best surprise ever!\"",
		"They promised to keep it a secret and to come back every day. {Name} felt {good} all the way home.",
	},
	{ // not listening, and learning to
		"{when}, {name}'s {parent} said, \"Do not go near the [river|big hill|old fence|deep pond] at {place}. It is not safe.\"",
		"But {name} was curious. When nobody was looking, {he} went there with {his} {obj}.",
		"{He} slipped and {his} {toy} fell {spot1}. {Name} could not reach it and {he} got very {bad}.",
		"\"Help!\" {name} [called|cried|shouted]. {His} {parent} heard {him} and came running.",
		"{His} {parent} got the {toy} back and gave {name} a big hug.",
		"\"I am sorry,\" {name} said. \"I should have listened to you.\"",
		"From then on, {name} always listened to {his} {parent}, and {he} kept {his} {obj} safe.",
	},
	{ // a new friend who is shy
		"{when}, a new {fkind} named {fname} came to {place}.",
		"{Fname} was shy and sat all alone {spot1}. {Fhe} looked {bad}.",
		"{Name} saw {fname} and walked over. \"Hello, my name is {name}. Do you want to play with me?\"",
		"{Fname} smiled a little. \"Yes, I would like that,\" {fhe} said [softly|quietly|shyly].",
		"They played with {name}'s {obj} all afternoon. They [laughed|ran|jumped] and had so much fun.",
		"When the sun went down, {fname} said, \"Thank you for being my friend.\" {Name} felt warm and {good} inside.",
	},
	{ // a gift for a parent
		"{when}, {name} wanted to make a gift for {his} {parent}.",
		"{He} went to {place} and picked the prettiest flowers {spot1}.",
		"Then {he} found {aobj} {spot2} and thought it would make the gift even better.",
		"{Fwho} helped {him} tie everything together with a string.",
		"When {his} {parent} saw the gift, {his} {parent} smiled a big smile. \"Thank you, {name}! I love it.\"",
		"{Name} was very {good}. Giving a gift felt even better than getting one.",
	},
}

var endings = []string{
	"And from that day on, {name} and {fname} were the best of friends.",
	"{Name} went home and told {his} {parent} all about {his} day. Then {he} fell asleep with a smile.",
	"The end.",
	"That night, {name} dreamed about {place}, and {he} was {good}.",
	"{Name} never forgot that day at {place}.",
	"And they all lived happily ever after.",
}

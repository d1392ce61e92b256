package corpus

// The word lists of the story grammar. They are chosen so that a story's
// choices (who, where, what) recur through it: a model has to remember a
// name, a pronoun, an object and its colour across a hundred words to
// predict the later mentions, which is where a larger model measurably
// beats a smaller one.

var girlNames = []string{"Lily", "Mia", "Sara", "Emma", "Lucy", "Anna", "Ella", "Zoe", "Amy", "Ruby",
	"Grace", "Chloe", "Maya", "Nora", "Ivy", "Rose", "Hannah", "Julia", "Kate", "Leah",
	"Molly", "Olivia", "Sophie", "Tina", "Daisy", "Eva", "Lola", "Nina", "Pia", "Sue"}

var boyNames = []string{"Tom", "Ben", "Max", "Sam", "Jack", "Leo", "Tim", "Noah", "Finn", "Luke",
	"Adam", "Eli", "Hugo", "Jake", "Liam", "Owen", "Paul", "Ryan", "Theo", "Will",
	"Alex", "Dan", "Joe", "Kai", "Milo", "Nick", "Oscar", "Pete", "Toby", "Zack"}

var petNames = []string{"Spot", "Bella", "Coco", "Pip", "Benny", "Fluffy", "Rosie", "Bubbles", "Ginger", "Lulu",
	"Buddy", "Pebble", "Sunny", "Bingo", "Hazel", "Biscuit", "Patch", "Nutmeg", "Dot", "Pogo"}

// animal is a kind of animal character with the sound it makes and how it moves.
type animal struct{ kind, sound, move string }

var animals = []animal{
	{"dog", "barked", "ran"}, {"cat", "meowed", "crept"}, {"bunny", "squeaked", "hopped"},
	{"bear", "growled", "walked"}, {"fox", "yipped", "trotted"}, {"duck", "quacked", "waddled"},
	{"mouse", "squeaked", "scurried"}, {"bird", "chirped", "flew"}, {"frog", "croaked", "jumped"},
	{"pig", "oinked", "trotted"}, {"lamb", "bleated", "skipped"}, {"owl", "hooted", "flew"},
	{"squirrel", "chattered", "scampered"}, {"turtle", "sighed", "crawled"}, {"puppy", "yapped", "ran"},
	{"kitten", "mewed", "pounced"},
}

var personAdjs = []string{"little", "small", "young", "kind", "happy", "shy", "brave", "curious", "clever", "funny", "gentle", "cheerful"}

var places = []place{
	{"the park", []string{"under the slide", "behind a big tree", "near the swings", "in the tall grass", "by the bench"}},
	{"the forest", []string{"under a pile of leaves", "behind a mossy log", "near a big oak tree", "by the little stream", "inside a hollow tree"}},
	{"the garden", []string{"under the rose bush", "behind the flower pots", "near the vegetable patch", "by the old fence", "in the tall sunflowers"}},
	{"the beach", []string{"under the warm sand", "behind a big rock", "near the waves", "by the sand castle", "in a tide pool"}},
	{"the farm", []string{"in the barn", "behind the hay", "near the duck pond", "by the red tractor", "under the apple tree"}},
	{"the meadow", []string{"in the tall grass", "behind a bush", "near the wild flowers", "by the little hill", "under a big stone"}},
	{"the pond", []string{"under a lily pad", "behind the reeds", "near the old dock", "by the muddy bank", "in the shallow water"}},
	{"the playground", []string{"under the slide", "behind the sandbox", "near the seesaw", "by the gate", "on the monkey bars"}},
	{"the village", []string{"near the bakery", "behind the well", "by the market stall", "under a cart", "in the town square"}},
	{"the hill", []string{"behind a big rock", "under a lonely tree", "near the top", "in the soft grass", "by the path"}},
	{"the river", []string{"under the bridge", "behind the rocks", "near the water", "by a fallen tree", "in the reeds"}},
	{"the zoo", []string{"near the monkeys", "behind the bench", "by the lion house", "under a big umbrella", "near the gate"}},
	{"the backyard", []string{"under the porch", "behind the shed", "near the swing", "by the fence", "in the flower bed"}},
	{"the school", []string{"under a desk", "behind the bookshelf", "near the window", "in the classroom", "by the door"}},
	{"the lake", []string{"near the shore", "behind the boat house", "by the big rocks", "under the pier", "in the reeds"}},
}

// place is where a story happens and the spots one can look in.
type place struct {
	name  string
	spots []string
}

var colors = []string{"red", "blue", "green", "yellow", "pink", "purple", "orange", "white", "shiny", "striped", "spotted", "golden"}

var toys = []string{"ball", "kite", "teddy bear", "toy car", "doll", "drum", "boat", "toy train", "robot", "puzzle",
	"book", "hat", "scarf", "blanket", "cup", "shell", "balloon", "bike", "wagon", "yo-yo", "whistle", "crown", "box", "bell"}

var foods = []string{"apple", "cookie", "cake", "sandwich", "pie", "muffin", "banana", "carrot", "pear", "cupcake", "biscuit", "plum"}

var activities = []string{"play with {his} {toy}", "run in the grass", "sing songs", "draw pictures", "read books",
	"dig in the sand", "climb trees", "splash in puddles", "look at the stars", "help {his} {parent}",
	"dance in the sun", "pick flowers", "build with blocks", "watch the clouds", "play games with friends"}

var times = []string{"Once upon a time", "One day", "One sunny morning", "One rainy afternoon", "Long ago",
	"One cold winter day", "One warm summer day", "Early one morning", "One windy day", "One bright spring day"}

// feeling words by mood.
var (
	goodFeelings = []string{"happy", "glad", "excited", "proud", "joyful", "thankful"}
	badFeelings  = []string{"sad", "upset", "worried", "scared", "lonely", "unhappy"}
)

var whens = []string{"One day", "One afternoon", "One morning", "The next day", "One Saturday", "Later that week", "One evening", "That summer"}

// fears and builds: the full phrase and the noun that later sentences use.
var fears = [][2]string{{"big storm", "storm"}, {"loud noise", "noise"}, {"dark shadow", "shadow"}, {"huge wave", "wave"},
	{"loud thunder clap", "thunder"}, {"strange sound", "sound"}}

var builds = [][2]string{{"tall tower", "tower"}, {"big castle", "castle"}, {"little house", "house"}, {"long bridge", "bridge"},
	{"sand castle", "castle"}, {"tree house", "tree house"}, {"snowman", "snowman"}}
